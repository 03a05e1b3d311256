"""The CDI specs of a pod (the claims of one netns) follow its claims, through the real Core
on the in-memory kernel: a claim made or ended, or a GID change, rewrites every spec of its
pod and no other, however many claims the node holds, and none whose bytes would not
change (the writes are counted)."""

from __future__ import annotations

import json
import os
from collections import Counter
from collections.abc import Iterator
from ipaddress import ip_interface
from pathlib import Path
from typing import Any

import pytest

import rdmad.daemon.cdi
from rdmad.core.store import Store
from rdmad.core.swapfile import StrPath, write_swapped
from rdmad.daemon.cdi import CdiWriter
from rdmad.model import Claim, ClaimOptions, NetnsMode
from tests.support.core_rig import Rig, Rigs
from tests.support.fake_kernel import FakeKernel

RAILS = 8
OTHER_PODS = 16  # each with a shared claim of every device: 128 claims besides the pod's


def node() -> FakeKernel:
    kernel = FakeKernel(NetnsMode.SHARED)
    for n in range(RAILS):
        kernel.add_nic(f"eth{n}", addresses=(f"192.0.2.{n + 1}/24",))
        kernel.add_rdma(f"mlx5_{n}", f"eth{n}")
    for name in ["pod", *(f"other{n}" for n in range(OTHER_PODS))]:
        kernel.add_netns(name)
    return kernel


def rail(n: int) -> ClaimOptions:
    return ClaimOptions(
        shared=True,
        ifname=f"net{n}",
        addresses=(ip_interface(f"10.{n}.0.5/16"),),
        pod_cdi_name="pod1",
    )


@pytest.fixture
def writes(monkeypatch: pytest.MonkeyPatch) -> Iterator[Counter[str]]:
    """The spec files the writer writes, by name, each time it writes one."""
    counted: Counter[str] = Counter()

    def counting(path: StrPath, data: bytes, spare: StrPath, mode: int) -> None:
        counted[os.path.basename(path)] += 1
        write_swapped(path, data, spare, mode)

    monkeypatch.setattr(rdmad.daemon.cdi, "write_swapped", counting)
    yield counted


async def started(rigs: Rigs, tmp_path: Path, others: bool) -> tuple[Rig, FakeKernel, Path]:
    """A daemon with a CDI writer, and when `others`, the claims of OTHER_PODS other pods."""
    kernel = node()
    rig = await rigs.start(kernel, Store(tmp_path / "state"), shared_limit=OTHER_PODS + 1)
    cdi = tmp_path / "cdi"
    rig.core.add_observer(CdiWriter(cdi, rig.core.pod_of))
    if others:
        for p in range(OTHER_PODS):
            for n in range(RAILS):
                options = ClaimOptions(shared=True, ifname=f"net{n}")
                await rig.core.claim(f"mlx5_{n}", rig.process.resolver.open(f"other{p}"), options)
    return rig, kernel, cdi


async def claim_rails(rig: Rig, count: int) -> list[Claim]:
    return [
        await rig.core.claim(f"mlx5_{n}", rig.process.resolver.open("pod"), rail(n))
        for n in range(count)
    ]


def env_of(path: Path) -> dict[str, str]:
    spec: Any = json.loads(path.read_text())
    return dict(e.split("=", 1) for e in spec["devices"][0]["containerEdits"]["env"])


async def test_every_spec_of_the_pod_has_the_same_env(rigs: Rigs, tmp_path: Path) -> None:
    rig, _, cdi = await started(rigs, tmp_path, others=False)
    await claim_rails(rig, RAILS)
    envs = [env_of(p) for p in sorted(cdi.glob("*.json"))]
    assert len(envs) == RAILS + 1  # and the pod CDI name's
    assert all(env == envs[0] for env in envs)
    assert envs[0]["NCCL_IB_HCA"] == "=" + ",".join(f"mlx5_{n}:1" for n in range(RAILS))


@pytest.mark.parametrize("others", [False, True], ids=["alone", "with-other-pods"])
async def test_a_claim_rewrites_its_pods_specs_only(
    rigs: Rigs, tmp_path: Path, writes: Counter[str], others: bool
) -> None:
    rig, _, _ = await started(rigs, tmp_path, others)
    await claim_rails(rig, RAILS - 1)
    writes.clear()
    await rig.core.claim(f"mlx5_{RAILS - 1}", rig.process.resolver.open("pod"), rail(RAILS - 1))
    # the new claim's spec, the 7 others' and the pod CDI name's: once each
    assert sum(writes.values()) == RAILS + 1 and set(writes.values()) == {1}


@pytest.mark.parametrize("others", [False, True], ids=["alone", "with-other-pods"])
async def test_a_release_rewrites_the_rest_of_its_pod_only(
    rigs: Rigs, tmp_path: Path, writes: Counter[str], others: bool
) -> None:
    rig, _, cdi = await started(rigs, tmp_path, others)
    claims = await claim_rails(rig, RAILS)
    writes.clear()
    await rig.core.release(claims[0].id)
    assert sum(writes.values()) == RAILS and set(writes.values()) == {1}
    assert not (cdi / f"rdmad.io-rdma-{claims[0].id}.json").exists()
    assert env_of(cdi / "rdmad.io-rdma-pod.pod1.json")["RDMAD_DEVICES"] == ",".join(
        f"mlx5_{n}" for n in range(1, RAILS)
    )


async def test_a_gid_change_rewrites_its_pods_specs(
    rigs: Rigs, tmp_path: Path, writes: Counter[str]
) -> None:
    rig, kernel, cdi = await started(rigs, tmp_path, others=False)
    await claim_rails(rig, 2)
    writes.clear()
    kernel.set_addresses("net1", (), netns="pod")
    await rig.seen.wait_for(lambda: len(rig.seen.changed) == 1)
    assert sum(writes.values()) == 3
    assert env_of(cdi / "rdmad.io-rdma-pod.pod1.json")["RDMAD_GID_INDEXES"] == "1,"


async def test_a_gid_change_the_env_does_not_show_rewrites_no_spec(
    rigs: Rigs, tmp_path: Path, writes: Counter[str]
) -> None:
    rig, kernel, _ = await started(rigs, tmp_path, others=False)
    await claim_rails(rig, 2)
    writes.clear()
    kernel.set_addresses("net1", ("10.1.0.5/16", "10.1.0.6/16"), netns="pod")
    await rig.seen.wait_for(lambda: len(rig.seen.changed) == 1)
    assert sum(writes.values()) == 0
