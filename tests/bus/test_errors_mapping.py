from __future__ import annotations

import errno

import pytest
from dbus_fast.errors import DBusError

from rdmad.errors import KernelError, RdmadError
from tests.bus.conftest import Live


def _instance(cls: type[RdmadError]) -> RdmadError:
    if cls is KernelError:
        return KernelError(errno.EIO, "moving mlx5_0")
    return cls(f"{cls.__name__} happened")


# Every error a caller can see: the hierarchy is one level deep under RdmadError.
@pytest.mark.parametrize("cls", RdmadError.__subclasses__(), ids=lambda c: c.__name__)
async def test_every_rdmad_error_reaches_the_caller_with_its_dbus_name(
    live: Live, cls: type[RdmadError]
) -> None:
    err = _instance(cls)
    live.core.fail_with = err
    with pytest.raises(DBusError) as caught:
        await live.call("SetNetnsMode", "s", ["exclusive"])
    assert caught.value.type == cls.dbus_name
    assert caught.value.text == str(err)


async def test_unexpected_exception_becomes_failed_and_the_connection_keeps_working(
    live: Live,
) -> None:
    live.core.fail_with = ZeroDivisionError("oops")
    with pytest.raises(DBusError) as caught:
        await live.call("SetNetnsMode", "s", ["exclusive"])
    assert caught.value.type == "io.rdmad1.Error.Failed"
    assert "ZeroDivisionError" in caught.value.text
    assert await live.call("ListClaims") == [[]]
