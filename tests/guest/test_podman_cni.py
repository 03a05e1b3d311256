"""podman 4.3 (CNI backend, crun) attaches a real rxe device through rdmad-cni, 7.3 guest.

The rxe device sits on the guest's virtio NIC. A shared attachment gives the container a
macvlan child with its IPAM address; a whole-device attachment (`netdev: false`, exclusive
mode: an rxe dies if its netdev moves) moves the RDMA device into the container's netns.
Each container runs with `--rm`: its removal is the runtime's CNI DEL, and the claim ends.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from testbed.daemon import Client, RdmadProcess
from tests.cni.podman import Podman
from tests.support.rdma import (
    known_to_rdmad,
    listed,
    rdma_dev_names,
    set_netns_mode,
    sh,
)

pytestmark = [
    pytest.mark.guest,
    pytest.mark.usefixtures("in_guest", "daemon_log_on_failure"),
]

DEVICE = "rxnic0"
ADDRESS = "192.0.2.40/24"


@pytest.fixture(scope="module")
def nic_rxe() -> Iterator[str]:
    """An rxe device on the guest's virtio NIC (up), removed afterwards."""
    nic = os.environ.get("RDMA_VM_NIC", "")
    assert nic, "the harness exports RDMA_VM_NIC"
    sh("ip", "link", "set", nic, "up")
    sh("rdma", "link", "add", DEVICE, "type", "rxe", "netdev", nic)
    try:
        yield DEVICE
    finally:
        sh("rdma", "link", "delete", DEVICE, check=False)


@pytest.fixture
def podman() -> Iterator[Podman]:
    # a short home: podman refuses a runroot path over 50 characters
    home = Path(sh("mktemp", "-d", "/tmp/pcXXXX").strip())
    pm = Podman(home, runtime="crun", run_flags=("--rm", "--cgroups=disabled"))
    pm.setup()
    yield pm
    pm.cleanup()
    sh("rm", "-rf", str(home), check=False)


def network(rdmad: RdmadProcess, **keys: Any) -> dict[str, Any]:
    return {"type": "rdmad", "device": DEVICE, "busAddress": rdmad.bus_address, **keys}


async def claimed_then_released(client: Client, since: int) -> tuple[list[Any], list[Any]]:
    """The Claimed signal a container's ADD caused, and the Released its removal caused."""
    made = await client.wait_signal("Claimed", lambda b: b[1] == DEVICE, since=since)
    ended = await client.wait_signal("Released", lambda b: b[0] == made[0], since=since)
    return made, ended


async def test_a_shared_attachment_gives_the_container_its_address_and_ends_with_it(
    client: Client, rdmad: RdmadProcess, nic_rxe: str, podman: Podman
) -> None:
    await known_to_rdmad(client, nic_rxe)
    ipam = {"type": "static", "addresses": [{"address": ADDRESS}]}
    podman.add_network("rdmashared", network(rdmad, shared=True, ipam=ipam))
    mark = client.mark()
    out = podman.run("shared1", "rdmashared", "ip", "-o", "addr", "show", "eth0")
    assert ADDRESS in out, out
    made, ended = await claimed_then_released(client, mark)
    assert ended == [made[0], nic_rxe, "requested"]
    assert (await listed(client))[nic_rxe][0] == "available"


@pytest.fixture
async def exclusive(client: Client) -> AsyncIterator[None]:
    await set_netns_mode(client, "exclusive")
    try:
        yield
    finally:
        with contextlib.suppress(Exception):
            await set_netns_mode(client, "shared")


async def test_a_whole_device_attachment_moves_the_rdma_device_in_and_home_again(
    client: Client, rdmad: RdmadProcess, nic_rxe: str, exclusive: None, podman: Podman
) -> None:
    await known_to_rdmad(client, nic_rxe)
    podman.add_network("rdmawhole", network(rdmad, netdev=False))
    mark = client.mark()
    out = podman.run("whole1", "rdmawhole", "ls", "/sys/class/infiniband")
    assert out.split() == [nic_rxe], out
    made, ended = await claimed_then_released(client, mark)
    assert ended == [made[0], nic_rxe, "requested"]
    assert nic_rxe in rdma_dev_names()
    assert (await listed(client))[nic_rxe][0] == "available"
