"""A claim's RDMA limit (its device's line in its cgroup's rdma.max): written once the
claim is placed, put back to `max` whenever the claim ends, and never left behind by a
failure or a crash. The real Core on the in-memory kernel and cgroup tree
(tests/support/fake_cgroups.py)."""

from __future__ import annotations

import asyncio
import errno
from dataclasses import replace
from pathlib import Path

import pytest

from rdmad.core.store import Store
from rdmad.errors import InvalidArgs, KernelError, NoSuchCgroup, NotSupported, RdmadError
from rdmad.model import Claim, ClaimOptions, RdmaLimit, RdmaUsage, ReleaseReason
from tests.support.core_rig import WAIT, Rig, Rigs, host_side, two_nics
from tests.support.fake_cgroups import NO_LIMIT
from tests.support.fake_kernel import FakeKernel

POD_CGROUP = "kubepods.slice/kubepods-pod1.slice"
LIMIT = RdmaLimit(hca_handle=1, hca_object=3)
LIMITED = ClaimOptions(shared=True, cgroup=POD_CGROUP, limit=LIMIT)
POD = "0f6a2c44-7d1e-4c8e-9a55-3b7e1c2d9f10"


def pod_kernel() -> FakeKernel:
    kernel = two_nics()
    kernel.cgroups.mkdir(POD_CGROUP)
    return kernel


async def limited(rigs: Rigs, tmp_path: Path) -> tuple[Rig, FakeKernel, Claim]:
    """A daemon on the pod's node, and a shared claim limited in the pod's cgroup."""
    kernel = pod_kernel()
    rig = await rigs.start(kernel, Store(tmp_path))
    claim = await rig.core.claim("mlx5_0", rig.process.resolver.open("pod"), LIMITED)
    return rig, kernel, claim


async def test_a_claim_writes_its_devices_line_and_enables_rdma_above_its_cgroup(
    rigs: Rigs, tmp_path: Path
) -> None:
    _, kernel, claim = await limited(rigs, tmp_path)
    assert (claim.cgroup, claim.limit) == (POD_CGROUP, LIMIT)
    assert kernel.cgroups.line(POD_CGROUP, "mlx5_0") == LIMIT
    assert kernel.cgroups.line(POD_CGROUP, "mlx5_1") == NO_LIMIT, "only its own device"
    assert kernel.cgroups.subtree_rdma == {"", "kubepods.slice"}


async def test_a_cgroup_named_absolute_is_kept_relative_to_the_mount(
    rigs: Rigs, tmp_path: Path
) -> None:
    rig = await rigs.start(pod_kernel(), Store(tmp_path))
    opts = replace(LIMITED, cgroup=f"/sys/fs/cgroup/{POD_CGROUP}")
    claim = await rig.core.claim("mlx5_0", rig.process.resolver.open("pod"), opts)
    assert claim.cgroup == POD_CGROUP


@pytest.mark.parametrize(
    ("cgroup", "controller", "error"),
    [
        ("kubepods.slice/../..", True, InvalidArgs),
        ("kubepods.slice/gone.slice", True, NoSuchCgroup),
        (POD_CGROUP, False, NotSupported),
    ],
)
async def test_a_cgroup_no_limit_can_go_in_is_refused_before_anything_moves(
    rigs: Rigs, tmp_path: Path, cgroup: str, controller: bool, error: type[RdmadError]
) -> None:
    kernel = pod_kernel()
    kernel.cgroups.controller = controller
    before = host_side(kernel)
    rig = await rigs.start(kernel, Store(tmp_path))
    with pytest.raises(error):
        await rig.core.claim(
            "mlx5_0", rig.process.resolver.open("pod"), replace(LIMITED, cgroup=cgroup)
        )
    assert rig.core.claims() == [] and kernel.links_in("pod") == []
    assert host_side(kernel) == before and kernel.cgroups.max == {}
    assert kernel.calls["add_macvlan"] == 0


async def test_a_limit_the_kernel_refuses_undoes_the_claim(rigs: Rigs, tmp_path: Path) -> None:
    kernel = pod_kernel()
    kernel.cgroups.fail("set_limit", KernelError(errno.EACCES, "writing rdma.max"))
    rig = await rigs.start(kernel, Store(tmp_path))
    with pytest.raises(KernelError, match="EACCES"):
        await rig.core.claim("mlx5_0", rig.process.resolver.open("pod"), LIMITED)
    await rig.quiesce()
    assert rig.core.claims() == [] and kernel.links_in("pod") == []
    assert kernel.cgroups.line(POD_CGROUP, "mlx5_0") == NO_LIMIT


async def test_a_release_puts_the_line_back_to_max(rigs: Rigs, tmp_path: Path) -> None:
    rig, kernel, claim = await limited(rigs, tmp_path)
    await rig.core.release(claim.id)
    assert kernel.cgroups.line(POD_CGROUP, "mlx5_0") == NO_LIMIT


async def test_the_netns_death_puts_the_line_back_to_max(rigs: Rigs, tmp_path: Path) -> None:
    rig, kernel, claim = await limited(rigs, tmp_path)
    kernel.delete_netns("pod")
    assert await rig.seen.wait_released(claim.id) == ReleaseReason.NETNS_GONE
    assert kernel.cgroups.line(POD_CGROUP, "mlx5_0") == NO_LIMIT


async def test_a_cgroup_gone_before_the_release_leaves_nothing_to_do(
    rigs: Rigs, tmp_path: Path
) -> None:
    rig, kernel, claim = await limited(rigs, tmp_path)
    kernel.cgroups.rmdir(POD_CGROUP)
    await rig.core.release(claim.id)
    assert rig.core.claims() == [] and POD_CGROUP not in kernel.cgroups.dirs


async def test_a_crash_after_the_limit_is_written_leaves_no_limit_after_the_restart(
    rigs: Rigs, tmp_path: Path
) -> None:
    """The limit is written after the PENDING save: a daemon killed at the next step (the
    char devices' read) is undone at its next start, the limit with it."""
    kernel = pod_kernel()
    rig = await rigs.start(kernel, Store(tmp_path))
    gate = kernel.pause("chardevs")
    task = asyncio.ensure_future(
        rig.core.claim("mlx5_0", rig.process.resolver.open("pod"), LIMITED)
    )
    await asyncio.wait_for(gate.reached.wait(), WAIT)
    assert kernel.cgroups.line(POD_CGROUP, "mlx5_0") == LIMIT
    fresh = await rig.restart()
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    await fresh.quiesce()
    assert fresh.core.claims() == [] and kernel.links_in("pod") == []
    assert kernel.cgroups.line(POD_CGROUP, "mlx5_0") == NO_LIMIT


async def test_a_live_limited_claim_keeps_its_limit_across_a_restart(
    rigs: Rigs, tmp_path: Path
) -> None:
    rig, kernel, claim = await limited(rigs, tmp_path)
    fresh = await rig.restart()
    (kept,) = fresh.core.claims()
    assert (kept.id, kept.cgroup, kept.limit) == (claim.id, POD_CGROUP, LIMIT)
    assert kernel.cgroups.line(POD_CGROUP, "mlx5_0") == LIMIT
    await fresh.core.release(claim.id)
    assert kernel.cgroups.line(POD_CGROUP, "mlx5_0") == NO_LIMIT


async def test_a_hold_writes_its_limit_when_attached_and_lifts_it_when_held_again(
    rigs: Rigs, tmp_path: Path
) -> None:
    kernel = pod_kernel()
    rig = await rigs.start(kernel, Store(tmp_path))
    held = await rig.core.hold("mlx5_0", POD, LIMITED)
    assert kernel.cgroups.max == {}, "a hold moves nothing and limits nothing"
    await rig.core.attach(POD, rig.process.resolver.open("pod"), "", ClaimOptions())
    assert kernel.cgroups.line(POD_CGROUP, "mlx5_0") == LIMIT
    await rig.core.detach(held.id)
    assert kernel.cgroups.line(POD_CGROUP, "mlx5_0") == NO_LIMIT


async def test_an_attach_naming_the_pods_cgroup_replaces_the_holds(
    rigs: Rigs, tmp_path: Path
) -> None:
    kernel = pod_kernel()
    kernel.cgroups.mkdir("kubepods/pod1")
    rig = await rigs.start(kernel, Store(tmp_path))
    await rig.core.hold("mlx5_0", POD, LIMITED)
    at_attach = ClaimOptions(cgroup="kubepods/pod1", limit=RdmaLimit(2, None))
    (claim,) = await rig.core.attach(POD, rig.process.resolver.open("pod"), "", at_attach)
    assert (claim.cgroup, claim.limit) == ("kubepods/pod1", RdmaLimit(2, None))
    assert kernel.cgroups.max == {("kubepods/pod1", "mlx5_0"): RdmaLimit(2, None)}


async def test_a_claim_with_a_cgroup_and_no_limit_writes_nothing_and_reads_its_usage(
    rigs: Rigs, tmp_path: Path
) -> None:
    kernel = pod_kernel()
    kernel.cgroups.current[(POD_CGROUP, "mlx5_0")] = RdmaLimit(1, 5)
    rig = await rigs.start(kernel, Store(tmp_path))
    opts = ClaimOptions(shared=True, cgroup=POD_CGROUP)
    claim = await rig.core.claim("mlx5_0", rig.process.resolver.open("pod"), opts)
    assert kernel.cgroups.max == {}
    assert rig.core.limits.usage(claim) == RdmaUsage(POD_CGROUP, RdmaLimit(1, 5), NO_LIMIT)
