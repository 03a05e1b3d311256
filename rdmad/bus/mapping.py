"""The one place where exceptions become D-Bus error replies (firewalld's decorator idea).

RdmadError subclasses reply with their own dbus_name and message. Anything unexpected is
logged with its traceback and replies io.rdmad1.Error.Failed with a short message: the
caller gets an answer, never a dropped call, and no traceback leaves the daemon.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Awaitable, Callable
from typing import ParamSpec, TypeVar

from dbus_fast.errors import DBusError

from rdmad.errors import RdmadError

log = logging.getLogger(__name__)

P = ParamSpec("P")
R = TypeVar("R")


def to_dbus_error(exc: BaseException) -> DBusError:
    if isinstance(exc, RdmadError):
        return DBusError(exc.dbus_name, str(exc) or type(exc).__name__)
    return DBusError(RdmadError.dbus_name, f"internal error: {type(exc).__name__}: {exc}")


def bus_errors(fn: Callable[P, Awaitable[R]]) -> Callable[P, Awaitable[R]]:
    """Wrap an async D-Bus method so every exception becomes the right DBusError.

    functools.wraps keeps __wrapped__, so dbus-fast still reads the original signature.
    """

    @functools.wraps(fn)
    async def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return await fn(*args, **kwargs)
        except RdmadError as exc:
            raise to_dbus_error(exc) from exc
        except Exception as exc:
            log.exception("unexpected error in D-Bus method %s", fn.__qualname__)
            raise to_dbus_error(exc) from exc

    return wrapper
