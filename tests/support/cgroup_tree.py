"""A directory tree shaped as a cgroup2 mount with the rdma controller, for rdmad's kernel
adapter (rdmad.kernel.cgroup) on a host whose kernel has none: its files are plain files,
so a write replaces what the kernel would merge (one device per test)."""

from __future__ import annotations

from pathlib import Path

from rdmad.kernel.cgroup import parse_line
from rdmad.model import RdmaLimit

MOUNT = Path("/sys/fs/cgroup")  # a real host's (or guest's) cgroup2 mount


def make_cgroup(directory: Path, controllers: str = "cpu memory rdma") -> None:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "cgroup.controllers").write_text(controllers + "\n")
    (directory / "cgroup.subtree_control").write_text("")


def make_tree(root: Path, *cgroups: str) -> Path:
    """A mount at `root` with `cgroups` (paths relative to it) and their ancestors."""
    make_cgroup(root)
    for cgroup in cgroups:
        parts = cgroup.split("/")
        for i in range(len(parts)):
            make_cgroup(root.joinpath(*parts[: i + 1]))
    return root


def written_line(root: Path, cgroup: str, device: str) -> RdmaLimit | None:
    """`device`'s line in the cgroup's rdma.max, None if rdmad never wrote one."""
    path = root / cgroup / "rdma.max"
    return parse_line(path.read_text(), device) if path.exists() else None


def line(cgroup: str, device: str, file: str = "rdma.max") -> RdmaLimit | None:
    """`device`'s line in a cgroup of the real cgroup2 mount (rdma.max or rdma.current)."""
    return parse_line((MOUNT / cgroup / file).read_text(), device)
