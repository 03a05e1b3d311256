"""What a link event re-reads: the RDMA devices on that netdev, found by index, and the
whole inventory only while a device without a netdev may be about to get this one. A device
whose netdev a claim took is without one on purpose. The real Core on the in-memory kernel."""

from __future__ import annotations

from collections import Counter
from ipaddress import ip_interface

from rdmad.model import Claim, ClaimOptions
from tests.support.core_rig import Rig, Rigs, two_nics
from tests.support.fake_kernel import FakeKernel

WHOLE = ClaimOptions(ifname="net0", addresses=(ip_interface("10.0.0.5/24"),))
POD_UID = "pod-uid-1"


async def rereads_of_a_new_netdev(rig: Rig, kernel: FakeKernel) -> Counter[str]:
    """The RDMA re-reads that someone's new netdev in init_net causes."""
    await rig.quiesce()
    before = Counter(kernel.calls)
    kernel.add_nic("dummy0")
    await rig.quiesce()
    return Counter({op: kernel.calls[op] - before[op] for op in ("list_devices", "get_device")})


async def attached_hold(rig: Rig) -> Claim:
    """mlx5_0 held for the pod, its netdev attached into `pod` as net0."""
    held = await rig.core.hold("mlx5_0", POD_UID, ClaimOptions(ifname="net0"))
    await rig.core.attach(POD_UID, rig.process.resolver.open("pod"), "", ClaimOptions())
    return held


async def test_a_new_netdev_rereads_nothing_while_a_claim_has_the_only_device_without_one(
    rigs: Rigs,
) -> None:
    kernel = two_nics()
    rig = await rigs.start(kernel)
    await rig.core.claim("mlx5_0", rig.process.resolver.open("pod"), WHOLE)
    assert await rereads_of_a_new_netdev(rig, kernel) == Counter()


async def test_a_new_netdev_rereads_nothing_while_an_attached_hold_has_its_devices_netdev(
    rigs: Rigs,
) -> None:
    kernel = two_nics()
    rig = await rigs.start(kernel)
    await attached_hold(rig)
    assert await rereads_of_a_new_netdev(rig, kernel) == Counter()


async def test_a_new_netdev_rereads_everything_once_a_detached_holds_netdev_is_moved_away(
    rigs: Rigs,
) -> None:
    kernel = two_nics()
    kernel.add_netns("elsewhere")
    rig = await rigs.start(kernel)
    held = await attached_hold(rig)
    await rig.core.detach(held.id)
    kernel.move_link("eth0", "elsewhere")  # someone else's move: not the hold's doing
    assert (await rereads_of_a_new_netdev(rig, kernel))["list_devices"] == 1


async def test_a_new_netdev_rereads_everything_once_a_claims_netdev_came_home_and_left(
    rigs: Rigs,
) -> None:
    kernel = two_nics()
    kernel.add_netns("elsewhere")
    rig = await rigs.start(kernel)
    claim = await rig.core.claim("mlx5_0", rig.process.resolver.open("pod"), WHOLE)
    await rig.core.release(claim.id)
    kernel.move_link("eth0", "elsewhere")
    assert (await rereads_of_a_new_netdev(rig, kernel))["list_devices"] == 1
