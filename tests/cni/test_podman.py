"""The real podman 4.3 (network_backend = "cni") attaching rdmad networks to containers."""

from __future__ import annotations

import json
import os
import shutil
import signal
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from testbed.net import addresses, ip, is_up, link
from tests.cni.conftest import CLAIM_SPECS, CniRig
from tests.cni.podman import Podman, require_podman

SUBNET = "10.88.77.0/24"


@pytest.fixture
def podman() -> Iterator[Podman]:
    require_podman()
    # podman refuses a runroot path longer than 50 characters: not under pytest's tmp_path.
    home = Path(tempfile.mkdtemp(prefix="rdmad-pm-"))
    pm = Podman(home)
    pm.setup()
    try:
        yield pm
    finally:
        pm.cleanup()
        shutil.rmtree(home, ignore_errors=True)


def rdmad_net(rig: CniRig, **keys: Any) -> dict[str, Any]:
    return {
        "type": "rdmad",
        "busAddress": rig.daemon.bus_address,
        "ipam": {"type": "host-local", "subnet": SUBNET, "dataDir": str(rig.ipam_dir)},
        **keys,
    }


async def claims(rig: CniRig) -> list[tuple[str, str]]:
    """(device, owner) of each live claim."""
    return [(row[1], row[4]) for row in await rig.client.manager("ListClaims")]


def host_view(rig: CniRig, device: str) -> tuple[str, int, bool]:
    info = link(rig.nic(device))
    assert info is not None, f"{rig.nic(device)} is not in the host netns"
    return info["ifname"], info["mtu"], is_up(info)


async def test_container_sees_its_interface_with_the_ipam_address(
    rig: CniRig, podman: Podman
) -> None:
    podman.add_network("rdma0", rdmad_net(rig, device="sim0"))
    out = podman.run("c1", "rdma0", "ip", "-o", "-4", "addr", "show", "eth0")
    assert "inet 10.88.77.2/24" in out


async def test_rm_f_brings_the_device_home_with_its_name_and_settings(
    rig: CniRig, podman: Podman
) -> None:
    ip("link", "set", rig.nic("sim0"), "mtu", "1450", "up")
    before = host_view(rig, "sim0")
    podman.add_network("rdma0", rdmad_net(rig, device="sim0"))
    podman.run("c1", "rdma0", "sleep", "600", detach=True)
    assert [d for d, _ in await claims(rig)] == ["sim0"]
    assert link(rig.nic("sim0")) is None  # in the container
    mark = rig.client.mark()
    podman("rm", "-f", "-t", "0", "c1")
    assert host_view(rig, "sim0") == before
    released = await rig.client.wait_signal("Released", since=mark)
    assert released[2] == "requested"  # by the plugin's DEL, not by the netns dying
    assert addresses(rig.nic("sim0")) == set()
    assert await claims(rig) == []


async def test_sigkilled_container_then_removed_brings_the_device_home(
    rig: CniRig, podman: Podman
) -> None:
    ip("link", "set", rig.nic("sim0"), "up")
    before = host_view(rig, "sim0")
    podman.add_network("rdma0", rdmad_net(rig, device="sim0"))
    podman.run("c1", "rdma0", "sleep", "600", detach=True)
    os.kill(podman.pid("c1"), signal.SIGKILL)
    podman("wait", "c1")
    podman("rm", "c1")
    assert host_view(rig, "sim0") == before
    assert await claims(rig) == []


async def test_two_containers_on_a_shared_network_hold_two_shared_claims(
    rig: CniRig, podman: Podman
) -> None:
    podman.add_network("rdmash", rdmad_net(rig, device="sim0", shared=True))
    podman.run("c1", "rdmash", "sleep", "600", detach=True)
    podman.run("c2", "rdmash", "sleep", "600", detach=True)
    ids = {podman("inspect", "--format", "{{.Id}}", c).strip() for c in ("c1", "c2")}
    assert sorted(await claims(rig)) == sorted(("sim0", f"cni/rdmash/{cid}/eth0") for cid in ids)
    path = await rig.client.manager("GetDevice", "s", "sim0")
    assert await rig.client.prop(path, "io.rdmad1.Device", "State") == "shared"
    podman("rm", "-f", "-t", "0", "c1", "c2")
    assert await claims(rig) == []


async def test_container_name_is_a_cdi_device_of_its_attachment(
    rig: CniRig, podman: Podman
) -> None:
    podman.add_network("rdmash", rdmad_net(rig, device="sim0", shared=True))
    podman.run("web", "rdmash", "sleep", "600", detach=True)
    (spec,) = [json.loads(p.read_text()) for p in rig.daemon.cdi_dir.glob(CLAIM_SPECS)]
    assert "web.eth0" in [d["name"] for d in spec["devices"]]


async def test_pod_name_is_a_cdi_device_of_the_pods_attachment(rig: CniRig, podman: Podman) -> None:
    podman.add_network("rdmash", rdmad_net(rig, device="sim0", shared=True))
    podman("pod", "create", "--name", "p1", "--network", "rdmash")
    podman("pod", "start", "p1")
    (spec,) = [json.loads(p.read_text()) for p in rig.daemon.cdi_dir.glob(CLAIM_SPECS)]
    # podman hands the pod's name to CNI as K8S_POD_NAME
    assert "p1.eth0" in [d["name"] for d in spec["devices"]]
    podman("pod", "rm", "-f", "p1")
    assert await claims(rig) == []
