"""rdmad.errors.from_errno: which named error a kernel errno becomes."""

from __future__ import annotations

import errno

from rdmad.errors import AccessDenied, KernelError, NotSupported, from_errno


def test_eperm_from_the_kernel_is_a_kernel_error_not_the_callers_access_denied() -> None:
    # A daemon without CAP_NET_ADMIN gets EPERM for a netns move: its set-up, not the caller.
    err = from_errno(errno.EPERM, "moving eth1")
    assert type(err) is KernelError
    assert not isinstance(err, AccessDenied)
    assert err.errno == errno.EPERM
    assert str(err) == "moving eth1: EPERM (Operation not permitted)"


def test_eopnotsupp_is_not_supported() -> None:
    assert type(from_errno(errno.EOPNOTSUPP, "moving mlx5_0")) is NotSupported


def test_any_other_errno_is_a_kernel_error_naming_it() -> None:
    err = from_errno(errno.EIO, "moving mlx5_0")
    assert type(err) is KernelError
    assert str(err) == "moving mlx5_0: EIO (Input/output error)"
