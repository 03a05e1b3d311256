"""An in-memory cgroup2 hierarchy with the rdma controller, behind rdmad.core.backend's
CgroupBackend, for the core's tests (the host's kernel has no rdma controller). It keeps
the kernel's rules the core depends on: a cgroup's rdma.max exists once its parent enables
rdma in subtree_control, one write changes one device's line, a removed cgroup takes its
lines with it. Paths are resolved lexically: the symlink rules are the kernel adapter's,
tested on a real directory tree (tests/unit/test_cgroup_adapter.py)."""

from __future__ import annotations

import errno
import posixpath

from rdmad.errors import InvalidArgs, KernelError, NoSuchCgroup, NotSupported, RdmadError
from rdmad.model import RdmaLimit, RdmaUsage

MOUNT = "/sys/fs/cgroup"
NO_LIMIT = RdmaLimit()


class FakeCgroups:
    def __init__(self) -> None:
        self.controller = True  # False: a kernel without CONFIG_CGROUP_RDMA
        self.dirs: set[str] = {""}
        self.subtree_rdma: set[str] = set()  # cgroups whose subtree_control lists rdma
        self.max: dict[tuple[str, str], RdmaLimit] = {}
        self.current: dict[tuple[str, str], RdmaLimit] = {}
        self._failures: dict[str, RdmadError] = {}

    # -- the world, as a test (or the kubelet) changes it --------------------------------

    def mkdir(self, path: str) -> None:
        parts = path.split("/")
        self.dirs.update("/".join(parts[: i + 1]) for i in range(len(parts)))

    def rmdir(self, path: str) -> None:
        self.dirs.discard(path)
        self.subtree_rdma.discard(path)
        for key in [k for k in self.max if k[0] == path]:
            del self.max[key]

    def line(self, cgroup: str, device: str) -> RdmaLimit:
        """`device`'s line in rdma.max, as `cat` shows it."""
        return self.max.get((cgroup, device), NO_LIMIT)

    def fail(self, op: str, error: RdmadError) -> None:
        """The next call of `op` fails with `error`, changing nothing."""
        self._failures[op] = error

    # -- CgroupBackend ---------------------------------------------------------------------

    def resolve(self, path: str) -> str:
        full = posixpath.normpath(posixpath.join(MOUNT, path))
        if not full.startswith(MOUNT + "/"):
            raise InvalidArgs(f"cgroup {path!r} is not a cgroup below {MOUNT}")
        rel = full[len(MOUNT) + 1 :]
        if rel not in self.dirs:
            raise NoSuchCgroup(f"cgroup {path!r}: no cgroup v2 directory {full}")
        if not self.controller:
            raise NotSupported(f"the cgroup2 hierarchy at {MOUNT} has no rdma controller")
        return rel

    def set_limit(self, cgroup: str, device: str, limit: RdmaLimit) -> None:
        self._enter("set_limit")
        if cgroup not in self.dirs:
            raise NoSuchCgroup(f"{cgroup} is gone")
        parts = cgroup.split("/")
        self.subtree_rdma.update("/".join(parts[:i]) for i in range(len(parts)))
        self.max[(cgroup, device)] = limit

    def lift(self, cgroup: str, device: str) -> None:
        self._enter("lift")
        if cgroup in self.dirs:
            self.max[(cgroup, device)] = NO_LIMIT

    def usage(self, cgroup: str, device: str) -> RdmaUsage | None:
        if cgroup not in self.dirs:
            return None
        return RdmaUsage(
            cgroup, self.current.get((cgroup, device), RdmaLimit(0, 0)), self.line(cgroup, device)
        )

    def _enter(self, op: str) -> None:
        failure = self._failures.pop(op, None)
        if failure is not None:
            raise failure


EACCES = KernelError(errno.EACCES, "writing rdma.max")
