"""A claim's cost does not grow with the node: the kernel calls that a claim, its release
and its netns's death cause (the events they raise included) are counted on a node of 2
RDMA devices and on one of 60, and must be the same."""

from __future__ import annotations

from collections import Counter
from collections.abc import Awaitable, Callable
from ipaddress import ip_interface
from pathlib import Path

import pytest

from rdmad.core.store import Store
from rdmad.model import ClaimOptions, NetnsMode
from tests.support.core_rig import Rig, Rigs
from tests.support.fake_kernel import FakeKernel

SMALL, LARGE = 2, 60
WHOLE = ClaimOptions(ifname="net0", mtu=9000, addresses=(ip_interface("10.0.0.5/24"),))
SHARED = ClaimOptions(shared=True, addresses=(ip_interface("10.0.0.6/24"),))
RDMA_ONLY = ClaimOptions(netdev=False)

Scenario = Callable[[Rig, FakeKernel], Awaitable[None]]


def node(devices: int, mode: NetnsMode) -> FakeKernel:
    """`devices` NICs, each up with an address and an RDMA device on it, and a netns pod."""
    kernel = FakeKernel(mode)
    for n in range(devices):
        kernel.add_nic(f"eth{n}", addresses=(f"192.0.{n // 250}.{n % 250 + 1}/16",))
        kernel.add_rdma(f"mlx5_{n}", f"eth{n}")
    kernel.add_netns("pod")
    return kernel


async def calls(
    rigs: Rigs, tmp_path: Path, devices: int, mode: NetnsMode, run: Scenario
) -> Counter[str]:
    """The kernel calls `run` causes on a node of `devices`, once all it set going is done."""
    kernel = node(devices, mode)
    rig = await rigs.start(kernel, Store(tmp_path / str(devices)))
    await rig.quiesce()
    before = Counter(kernel.calls)
    await run(rig, kernel)
    await rig.quiesce()
    return kernel.calls - before


async def same_on_both(rigs: Rigs, tmp_path: Path, mode: NetnsMode, run: Scenario) -> None:
    small = await calls(rigs, tmp_path, SMALL, mode, run)
    large = await calls(rigs, tmp_path, LARGE, mode, run)
    assert small == large
    assert "list_devices" not in large and "list_netdevs" not in large


def claim_and_release(options: ClaimOptions) -> Scenario:
    async def run(rig: Rig, kernel: FakeKernel) -> None:
        claim = await rig.core.claim("mlx5_0", rig.process.resolver.open("pod"), options)
        await rig.core.release(claim.id)

    return run


def claim_then_netns_dies(options: ClaimOptions) -> Scenario:
    async def run(rig: Rig, kernel: FakeKernel) -> None:
        claim = await rig.core.claim("mlx5_0", rig.process.resolver.open("pod"), options)
        kernel.delete_netns("pod")
        await rig.seen.wait_released(claim.id)

    return run


# What a claim costs, by scenario: the netns mode, the claim's options, how it ends.
SCENARIOS = {
    "whole-released": (NetnsMode.SHARED, claim_and_release(WHOLE)),
    "shared-released": (NetnsMode.SHARED, claim_and_release(SHARED)),
    "exclusive-released": (NetnsMode.EXCLUSIVE, claim_and_release(WHOLE)),
    "rdma-only-released": (NetnsMode.EXCLUSIVE, claim_and_release(RDMA_ONLY)),
    "whole-netns-died": (NetnsMode.SHARED, claim_then_netns_dies(WHOLE)),
    "exclusive-netns-died": (NetnsMode.EXCLUSIVE, claim_then_netns_dies(WHOLE)),
}


@pytest.mark.parametrize("scenario", list(SCENARIOS))
async def test_a_claim_and_its_end_cost_the_same_on_a_node_of_2_and_of_60(
    rigs: Rigs, tmp_path: Path, scenario: str
) -> None:
    mode, run = SCENARIOS[scenario]
    await same_on_both(rigs, tmp_path, mode, run)
