"""A claim that leaves its netns takes its devices out of the specs of the pod it left, by
every way out: a detach, a release, the netns's death, an Attach undone, and a restart that
finds the netns gone. The scene: a hold (mlx5_0) attached to the pod's netns, then a claim
(mlx5_1) with a pod CDI name joining it, so the pod-wide spec names both. The real Core and
CdiWriter on the in-memory kernel."""

from __future__ import annotations

import json
from ipaddress import ip_interface
from pathlib import Path
from typing import Any

import pytest

from rdmad.core.store import Store
from rdmad.daemon.cdi import CdiWriter
from rdmad.errors import NoSuchDevice
from rdmad.model import Claim, ClaimOptions, ClaimPhase, ReleaseReason
from tests.support.core_rig import Rig, Rigs, two_nics
from tests.support.fake_kernel import FakeKernel

POD = "0f6a2c44-7d1e-4c8e-9a55-3b7e1c2d9f10"
HELD = ClaimOptions(shared=True, ifname="rdma0")
ATTACH = ClaimOptions(addresses=(ip_interface("10.0.0.5/24"),))
JOINING = ClaimOptions(
    shared=True, ifname="net1", addresses=(ip_interface("10.1.0.5/24"),), pod_cdi_name="web"
)


def pod_spec(cdi: Path) -> Path:
    return cdi / "rdmad.io-rdma-pod.web.json"


def nodes_of(spec: Path) -> set[str]:
    data: Any = json.loads(spec.read_text())
    return {n["path"] for n in data["devices"][0]["containerEdits"]["deviceNodes"]}


def nodes_of_claim(claim: Claim) -> set[str]:
    return {c.path for c in claim.chardevs}


async def with_writer(rig: Rig, cdi: Path) -> None:
    """As rdmad.daemon.main: the writer syncs with the claims the start kept, then observes."""
    writer = CdiWriter(cdi, rig.core.pod_of)
    writer.sync([c for c in rig.core.claims() if c.phase in (ClaimPhase.ACTIVE, ClaimPhase.HELD)])
    rig.core.add_observer(writer)


async def scene(rigs: Rigs, tmp_path: Path) -> tuple[Rig, FakeKernel, Claim, Claim]:
    """The hold attached, the claim joined: the pod spec names both claims' devices."""
    kernel = two_nics()
    rig = await rigs.start(kernel, Store(tmp_path / "state"))
    await with_writer(rig, tmp_path / "cdi")
    held = await rig.core.hold("mlx5_0", POD, HELD)
    await rig.core.attach(POD, rig.process.resolver.open("pod"), "", ATTACH)
    joined = await rig.core.claim("mlx5_1", rig.process.resolver.open("pod"), JOINING)
    assert nodes_of_claim(held) <= nodes_of(pod_spec(tmp_path / "cdi"))
    return rig, kernel, held, joined


@pytest.mark.parametrize("way_out", ["detach", "release"])
async def test_a_detach_or_a_release_takes_the_held_claims_devices_out_of_the_pod_spec(
    rigs: Rigs, tmp_path: Path, way_out: str
) -> None:
    rig, _, held, joined = await scene(rigs, tmp_path)
    await getattr(rig.core, way_out)(held.id)
    assert nodes_of(pod_spec(tmp_path / "cdi")) == nodes_of_claim(joined)


async def test_the_netns_death_leaves_no_spec_naming_the_pods_devices(
    rigs: Rigs, tmp_path: Path
) -> None:
    rig, kernel, held, joined = await scene(rigs, tmp_path)
    kernel.delete_netns("pod")
    assert await rig.seen.wait_released(joined.id) == ReleaseReason.NETNS_GONE
    await rig.seen.wait_for(lambda: held.phase == ClaimPhase.HELD)
    await rig.quiesce()
    assert not pod_spec(tmp_path / "cdi").exists()
    assert [p.name for p in (tmp_path / "cdi").glob("*.json")] == [f"rdmad.io-rdma-{held.id}.json"]


async def test_an_attach_undone_leaves_the_pod_spec_without_its_devices(
    rigs: Rigs, tmp_path: Path
) -> None:
    kernel = two_nics()
    rig = await rigs.start(kernel, Store(tmp_path / "state"))
    await with_writer(rig, tmp_path / "cdi")
    joined = await rig.core.claim("mlx5_1", rig.process.resolver.open("pod"), JOINING)
    held = await rig.core.hold("mlx5_0", POD, HELD)
    kernel.fail("chardevs", NoSuchDevice("gone mid-way"))
    with pytest.raises(NoSuchDevice):
        await rig.core.attach(POD, rig.process.resolver.open("pod"), "", ATTACH)
    assert held.phase == ClaimPhase.HELD
    assert nodes_of(pod_spec(tmp_path / "cdi")) == nodes_of_claim(joined)


async def test_a_restart_that_finds_the_netns_gone_leaves_no_spec_naming_the_pods_devices(
    rigs: Rigs, tmp_path: Path
) -> None:
    rig, kernel, held, _ = await scene(rigs, tmp_path)
    await rig.crash()
    kernel.delete_netns("pod")
    fresh = await rigs.start(kernel, Store(tmp_path / "state"))
    await with_writer(fresh, tmp_path / "cdi")
    await fresh.quiesce()
    assert [c.phase for c in fresh.core.claims()] == [ClaimPhase.HELD]
    assert not pod_spec(tmp_path / "cdi").exists()
    assert [p.name for p in (tmp_path / "cdi").glob("*.json")] == [f"rdmad.io-rdma-{held.id}.json"]


async def test_specs_of_holds_waiting_for_their_pods_are_each_their_own_pod(
    rigs: Rigs, tmp_path: Path
) -> None:
    rig = await rigs.start(two_nics(), Store(tmp_path / "state"))
    first = await rig.core.hold("mlx5_0", POD, HELD)
    second = await rig.core.hold("mlx5_1", "5b1e9d2a-0c3f-4f7a-8e61-2d4c6b8a0e97", HELD)
    await with_writer(rig, tmp_path / "cdi")
    for claim in (first, second):
        spec: Any = json.loads((tmp_path / "cdi" / f"rdmad.io-rdma-{claim.id}.json").read_text())
        env = dict(e.split("=", 1) for e in spec["devices"][0]["containerEdits"]["env"])
        assert env["RDMAD_DEVICE"] == claim.device
