"""A pod of several rails: the CDI specs the real daemon writes for the claims of one netns
(sim RDMA on real veths, a private bus). Every spec of the pod carries the same env, which
names all its rails; a release rewrites the rest; a pod CDI name lists all their devices."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from dbus_fast import Variant

from rdmad.errors import InvalidArgs
from testbed.daemon import DBusCallError
from testbed.net import temp_netns
from tests.support.sim_rig import Rig, running_rig

CLAIM_IFACE = "io.rdmad1.Claim"
WHOLE = [f"sim{n}" for n in range(4)]
SHARED = [f"sim{n}" for n in range(4, 8)]


@pytest.fixture
async def rails(bus_address: str, tmp_path: Path) -> AsyncIterator[Rig]:
    """rdmad with 8 sim devices, sim0..sim7, each on its own veth."""
    async with running_rig(bus_address, tmp_path, devices=8) as rig:
        yield rig


async def claim(rig: Rig, device: str, netns: str, n: int, **kw: Variant) -> str:
    """Rail `n` of the pod: its interface net<n>, its address 10.0.<n>.5/24."""
    options = {"ifname": Variant("s", f"net{n}"), "pod_cdi_name": Variant("s", "pod1"), **kw}
    if device in SHARED:
        options["shared"] = Variant("b", True)
        options["addresses"] = Variant("as", [f"10.0.{n}.5/24"])
    path: str = await rig.client.manager("Claim", "ssa{sv}", device, netns, options)
    value: str = await rig.client.prop(path, CLAIM_IFACE, "Id")
    return value


async def claim_pod(rig: Rig, netns: str) -> list[str]:
    return [await claim(rig, dev, netns, n) for n, dev in enumerate(WHOLE + SHARED)]


def spec(rig: Rig, name: str) -> Any:
    return json.loads((rig.daemon.cdi_dir / f"rdmad.io-rdma-{name}.json").read_text())


def env(rig: Rig, name: str) -> list[str]:
    value: list[str] = spec(rig, name)["devices"][0]["containerEdits"]["env"]
    return value


def as_dict(entries: list[str]) -> dict[str, str]:
    pairs = [e.split("=", 1) for e in entries]
    assert len({k for k, _ in pairs}) == len(pairs), f"a key given twice in {entries}"
    return dict(pairs)


async def test_every_spec_of_a_pod_has_the_same_pod_wide_env(rails: Rig, netns: str) -> None:
    ids = await claim_pod(rails, netns)
    envs = [env(rails, cid) for cid in [*ids, "pod.pod1"]]
    assert all(e == envs[0] for e in envs)
    values = as_dict(envs[0])
    assert values["NCCL_IB_HCA"] == "=" + ",".join(f"sim{n}:1" for n in range(8))
    assert values["NCCL_IB_HCA"].count("=") == 1
    assert values["RDMAD_DEVICES"] == ",".join(f"sim{n}" for n in range(8))
    assert values["RDMAD_IFNAMES"] == ",".join(f"net{n}" for n in range(8))
    assert not {"RDMAD_DEVICE", "RDMAD_PORT", "RDMAD_GID_INDEX"} & values.keys()


async def test_whole_and_shared_rails_differ_in_gid_index_so_nccl_picks_per_port(
    rails: Rig, netns: str
) -> None:
    ids = await claim_pod(rails, netns)
    values = as_dict(env(rails, ids[0]))
    # sim: a whole device's RoCE v2 entry is 1 (link-local), a shared child's 3 (its IPv4)
    assert values["RDMAD_GID_INDEXES"] == "1,1,1,1,3,3,3,3"
    assert "NCCL_IB_GID_INDEX" not in values
    assert values["NCCL_IB_ADDR_FAMILY"] == "AF_INET"
    assert values["NCCL_IB_ROCE_VERSION_NUM"] == "2"


async def test_rails_that_agree_give_nccl_their_one_gid_index(rails: Rig, netns: str) -> None:
    ids = [await claim(rails, dev, netns, n) for n, dev in enumerate(SHARED)]
    values = as_dict(env(rails, ids[0]))
    assert values["NCCL_IB_GID_INDEX"] == "3"
    assert "NCCL_IB_ADDR_FAMILY" not in values


async def test_a_release_rewrites_the_other_specs_of_the_pod(rails: Rig, netns: str) -> None:
    ids = await claim_pod(rails, netns)
    mark = rails.client.mark()
    await rails.client.manager("Release", "s", ids[0])
    await rails.client.wait_signal("Released", since=mark)
    assert not (rails.daemon.cdi_dir / f"rdmad.io-rdma-{ids[0]}.json").exists()
    for name in [*ids[1:], "pod.pod1"]:
        assert as_dict(env(rails, name))["RDMAD_DEVICES"] == ",".join(
            f"sim{n}" for n in range(1, 8)
        )


async def test_the_pod_cdi_name_lists_every_rails_devices(rails: Rig, netns: str) -> None:
    ids = await claim_pod(rails, netns)
    pod = spec(rails, "pod.pod1")["devices"]
    assert [d["name"] for d in pod] == ["pod1"]
    own = {
        n["path"]
        for cid in ids
        for n in spec(rails, cid)["devices"][0]["containerEdits"]["deviceNodes"]
    }
    nodes = [n["path"] for n in pod[0]["containerEdits"]["deviceNodes"]]
    assert sorted(nodes) == sorted(own) and len(nodes) == len(set(nodes))


async def test_the_pod_spec_goes_with_the_pods_last_claim(rails: Rig, netns: str) -> None:
    ids = [await claim(rails, dev, netns, n) for n, dev in enumerate(SHARED[:2])]
    for cid in ids:
        mark = rails.client.mark()
        await rails.client.manager("Release", "s", cid)
        await rails.client.wait_signal("Released", since=mark)
    assert list(rails.daemon.cdi_dir.glob("*.json")) == []


async def test_a_pod_cdi_name_belongs_to_one_netns(rails: Rig, netns: str) -> None:
    await claim(rails, "sim4", netns, 4)
    with temp_netns() as other, pytest.raises(DBusCallError) as caught:
        await claim(rails, "sim5", other, 5)
    assert caught.value.name == InvalidArgs.dbus_name
    assert "pod CDI name 'pod1' is taken" in caught.value.message
