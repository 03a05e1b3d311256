"""The rdma controller of cgroup v2 (Documentation/admin-guide/cgroup-v2.rst, "RDMA"):
one line per device in a cgroup's rdma.max and rdma.current,
`mlx5_0 hca_handle=2 hca_object=2000`, `max` for no limit. A write names one device and
changes only its line. rdma.max exists in a cgroup once its parent lists rdma in
cgroup.subtree_control, which needs the same of every ancestor from the root down.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path

from rdmad.errors import InvalidArgs, KernelError, NoSuchCgroup, NotSupported, from_errno
from rdmad.model import RdmaLimit, RdmaUsage

CGROUP2_MOUNT = Path("/sys/fs/cgroup")
CONTROLLER = "rdma"
_MAX = "max"


def format_limit(device: str, limit: RdmaLimit) -> str:
    """`device`'s line as rdma.max takes it."""

    def value(v: int | None) -> str:
        return _MAX if v is None else str(v)

    return f"{device} hca_handle={value(limit.hca_handle)} hca_object={value(limit.hca_object)}"


def parse_line(text: str, device: str) -> RdmaLimit | None:
    """`device`'s line of an rdma.max or rdma.current, None if it has none."""
    for line in text.splitlines():
        name, *pairs = line.split()
        if name != device:
            continue
        values = dict(p.partition("=")[::2] for p in pairs)
        return RdmaLimit(_value(values, "hca_handle"), _value(values, "hca_object"))
    return None


def _value(values: dict[str, str], key: str) -> int | None:
    v = values.get(key, _MAX)
    return None if v == _MAX else int(v)


class KernelCgroups:
    """The cgroup2 hierarchy mounted at `mount` (CgroupBackend)."""

    def __init__(self, mount: Path = CGROUP2_MOUNT) -> None:
        self._mount = mount

    def resolve(self, path: str) -> str:
        real = Path(os.path.realpath(self._mount / path))  # an absolute `path` replaces it
        mount = Path(os.path.realpath(self._mount))
        if mount not in real.parents:
            raise InvalidArgs(f"cgroup {path!r} is not a cgroup below {self._mount}")
        if not (real / "cgroup.controllers").is_file():
            raise NoSuchCgroup(f"cgroup {path!r}: no cgroup v2 directory {real}")
        if CONTROLLER not in self._read(mount / "cgroup.controllers").split():
            raise NotSupported(
                f"the cgroup2 hierarchy at {self._mount} has no rdma controller "
                "(a kernel without CONFIG_CGROUP_RDMA): RDMA limits are not supported"
            )
        return str(real.relative_to(mount))

    def set_limit(self, cgroup: str, device: str, limit: RdmaLimit) -> None:
        directory = self._mount / cgroup
        for ancestor in reversed(directory.parents):
            if ancestor == self._mount or self._mount in ancestor.parents:
                self._enable(ancestor)
        self._write(directory / "rdma.max", format_limit(device, limit))

    def lift(self, cgroup: str, device: str) -> None:
        try:
            self._write(self._mount / cgroup / "rdma.max", format_limit(device, RdmaLimit()))
        except NoSuchCgroup:
            pass  # the cgroup is gone: the line went with it
        except KernelError as exc:
            if exc.errno != errno.ENODEV:
                raise  # ENODEV: the device is gone, and its line with it

    def usage(self, cgroup: str, device: str) -> RdmaUsage | None:
        directory = self._mount / cgroup
        try:
            current = parse_line(self._read(directory / "rdma.current"), device)
            limit = parse_line(self._read(directory / "rdma.max"), device)
        except NoSuchCgroup:
            return None
        return RdmaUsage(cgroup, current or RdmaLimit(0, 0), limit or RdmaLimit())

    def _enable(self, directory: Path) -> None:
        control = directory / "cgroup.subtree_control"
        if CONTROLLER not in self._read(control).split():
            self._write(control, f"+{CONTROLLER}")

    @staticmethod
    def _read(path: Path) -> str:
        try:
            return path.read_text()
        except FileNotFoundError:
            raise NoSuchCgroup(f"{path} does not exist (the cgroup is gone?)") from None
        except OSError as exc:
            raise from_errno(exc.errno or errno.EIO, f"reading {path}") from None

    @staticmethod
    def _write(path: Path, line: str) -> None:
        """One write, as the kernel parses it: a file that is not there is NoSuchCgroup; a
        device the kernel does not know is a KernelError with ENODEV."""
        try:
            with path.open("w") as f:
                f.write(line + "\n")
        except FileNotFoundError:
            raise NoSuchCgroup(f"{path} does not exist (the cgroup is gone?)") from None
        except OSError as exc:
            raise from_errno(exc.errno or errno.EIO, f"writing {line!r} to {path}") from None
