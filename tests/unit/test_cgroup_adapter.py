"""rdmad.kernel.cgroup on a directory tree shaped as a cgroup2 mount (this host's kernel
has no rdma controller, and the tests need no root): which paths name a cgroup rdmad may
limit, what it writes where, and what it reads back. The kernel's own parsing of a write
is the guest tests' (tests/guest/test_rdma_cgroup.py)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from rdmad.errors import InvalidArgs, NoSuchCgroup, NotSupported
from rdmad.kernel.cgroup import KernelCgroups, format_limit, parse_line
from rdmad.model import RdmaLimit, RdmaUsage
from tests.support.cgroup_tree import make_cgroup, make_tree

POD = "kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod1.slice"


@pytest.fixture
def mount(tmp_path: Path) -> Path:
    return make_tree(tmp_path / "cgroup", POD)


@pytest.mark.parametrize("form", ["relative", "absolute", "dotted"])
def test_a_cgroup_is_named_relative_to_the_mount_or_absolute_under_it(
    mount: Path, form: str
) -> None:
    named = {
        "relative": POD,
        "absolute": str(mount / POD),
        "dotted": f"kubepods.slice/./x/../{POD.split('/', 1)[1]}",
    }[form]
    assert KernelCgroups(mount).resolve(named) == POD


@pytest.mark.parametrize("path", ["..", "../..", "kubepods.slice/../..", "/etc", ""])
def test_a_path_that_leaves_the_mount_or_names_its_root_is_invalid_args(
    mount: Path, path: str
) -> None:
    with pytest.raises(InvalidArgs, match="is not a cgroup below"):
        KernelCgroups(mount).resolve(path)


def test_a_symlink_out_of_the_mount_is_invalid_args(mount: Path, tmp_path: Path) -> None:
    outside = tmp_path / "elsewhere"
    make_cgroup(outside)
    os.symlink(outside, mount / "kubepods.slice" / "link")
    with pytest.raises(InvalidArgs, match="is not a cgroup below"):
        KernelCgroups(mount).resolve("kubepods.slice/link")


def test_a_missing_cgroup_is_no_such_cgroup(mount: Path) -> None:
    with pytest.raises(NoSuchCgroup, match="no cgroup v2 directory"):
        KernelCgroups(mount).resolve("kubepods.slice/gone.slice")


def test_a_hierarchy_without_the_rdma_controller_is_not_supported(tmp_path: Path) -> None:
    root = tmp_path / "cgroup"
    make_cgroup(root, "cpu memory io")
    make_cgroup(root / "pod")
    with pytest.raises(NotSupported, match="no rdma controller"):
        KernelCgroups(root).resolve("pod")


def test_a_limit_enables_rdma_down_to_the_cgroups_parent_then_writes_the_devices_line(
    mount: Path,
) -> None:
    (mount / "kubepods.slice" / "cgroup.subtree_control").write_text("cpu rdma\n")
    KernelCgroups(mount).set_limit(POD, "mlx5_0", RdmaLimit(2, None))
    written = {
        str(p.parent.relative_to(mount)): p.read_text()
        for p in mount.rglob("cgroup.subtree_control")
    }
    assert written == {
        ".": "+rdma\n",
        "kubepods.slice": "cpu rdma\n",  # listed already: left alone
        "kubepods.slice/kubepods-besteffort.slice": "+rdma\n",
        POD: "",  # the cgroup's own children are not its business
    }
    assert (mount / POD / "rdma.max").read_text() == "mlx5_0 hca_handle=2 hca_object=max\n"


def test_lifting_writes_max_and_a_cgroup_that_is_gone_leaves_nothing_to_do(mount: Path) -> None:
    cgroups = KernelCgroups(mount)
    cgroups.lift(POD, "mlx5_0")
    assert (mount / POD / "rdma.max").read_text() == "mlx5_0 hca_handle=max hca_object=max\n"
    cgroups.lift("kubepods.slice/gone.slice", "mlx5_0")
    assert not (mount / "kubepods.slice" / "gone.slice").exists()


def test_usage_is_the_devices_lines_of_rdma_current_and_rdma_max(mount: Path) -> None:
    (mount / POD / "rdma.current").write_text(
        "mlx5_0 hca_handle=1 hca_object=7\nmlx5_1 hca_handle=0 hca_object=0\n"
    )
    (mount / POD / "rdma.max").write_text(
        "mlx5_0 hca_handle=1 hca_object=max\nmlx5_1 hca_handle=max hca_object=max\n"
    )
    cgroups = KernelCgroups(mount)
    assert cgroups.usage(POD, "mlx5_0") == RdmaUsage(POD, RdmaLimit(1, 7), RdmaLimit(1, None))
    assert cgroups.usage("kubepods.slice/gone.slice", "mlx5_0") is None


@pytest.mark.parametrize(
    "limit", [RdmaLimit(), RdmaLimit(1, None), RdmaLimit(None, 3), RdmaLimit(0, 2000)]
)
def test_a_line_reads_back_as_written(limit: RdmaLimit) -> None:
    assert parse_line(format_limit("rxe0", limit), "rxe0") == limit
    assert parse_line(format_limit("rxe0", limit), "rxe1") is None
