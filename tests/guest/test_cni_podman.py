"""The real podman (CNI backend) attaching rdmad networks on a real rxe device: a shared
attachment (a macvlan child of the rxe's netdev), and a whole-device attachment in
exclusive mode (the rxe device itself moves; a software device's netdev must stay, so the
network says netdev=false). Each claim ends when its container is removed."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.cni.podman import Podman, require_podman
from tests.support.daemon import Client, RdmadProcess
from tests.support.rdma import Rxe, known_to_rdmad, set_netns_mode

# s per podman command: under TCG on a loaded host one `podman run` took over 2 minutes
PODMAN_TIMEOUT = 900.0

pytestmark = [pytest.mark.guest, pytest.mark.usefixtures("in_guest", "daemon_log_on_failure")]


@pytest.fixture
def podman() -> Iterator[Podman]:
    require_podman()
    home = Path(tempfile.mkdtemp(prefix="rdmad-pm-"))  # tmpfs in the guest
    pm = Podman(home, timeout=PODMAN_TIMEOUT)
    pm.setup()
    try:
        yield pm
    finally:
        pm.cleanup()
        shutil.rmtree(home, ignore_errors=True)


def network(rdmad: RdmadProcess, home: Path, **keys: Any) -> dict[str, Any]:
    return {
        "type": "rdmad",
        "busAddress": rdmad.bus_address,
        "ipam": {"type": "host-local", "subnet": "10.66.0.0/24", "dataDir": str(home / "ipam")},
        **keys,
    }


async def claims(client: Client) -> list[tuple[str, bool]]:
    rows = await client.manager("ListClaims")
    return [(row[1], row[4].startswith("cni/")) for row in rows]


async def test_shared_attachment_on_rxe_ends_with_its_container(
    rdmad: RdmadProcess, client: Client, rxe: Rxe, podman: Podman
) -> None:
    await known_to_rdmad(client, rxe.name)
    podman.add_network("rxeshared", network(rdmad, podman.home, device=rxe.name, shared=True))
    podman.run("c1", "rxeshared", "sleep", "600", detach=True)
    assert await claims(client) == [(rxe.name, True)]
    out = podman("exec", "c1", "ip", "-o", "-4", "addr", "show", "eth0")
    assert "inet 10.66.0.2/24" in out
    podman("rm", "-f", "-t", "0", "c1")
    assert await claims(client) == []


async def test_whole_rxe_attachment_in_exclusive_mode_ends_with_its_container(
    rdmad: RdmadProcess, client: Client, rxe: Rxe, podman: Podman
) -> None:
    await known_to_rdmad(client, rxe.name)
    await set_netns_mode(client, "exclusive")
    try:
        net = network(rdmad, podman.home, device=rxe.name, netdev=False)
        del net["ipam"]
        podman.add_network("rxewhole", net)
        podman.run("c2", "rxewhole", "sleep", "600", detach=True)
        assert await claims(client) == [(rxe.name, True)]
        out = podman("exec", "c2", "ls", "/sys/class/infiniband")
        assert rxe.name in out.split()
        podman("rm", "-f", "-t", "0", "c2")
        assert await claims(client) == []
    finally:
        podman.cleanup()
        await set_netns_mode(client, "shared")
