"""RDMA for a rootless container, as docs/rootless.md has a user do it: an unprivileged
user whom a polkit rule allows shares makes a rootless podman 4.3 pod, claims a share of a
sim device into the pod's netns with rdmactl, and runs a container given the claim by its
CDI name. The container sees the claim's char devices and env, and the macvlan with its
address; the user releases the claim again.

The test makes the user (tests/support/rootless.py) and runs polkitd
(testbed/polkit.py) and rdmad on a private bus. A sim device has no char devices:
the test makes the nodes its claim's spec names in the /dev of the user's mount namespace
(rootless runc bind-mounts each from there). podman runs with runc and cgroupfs: on this
machine kind's hybrid cgroups crun refuses to start.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from testbed.bus import start_private_bus
from testbed.net import link
from testbed.polkit import start_polkitd
from tests.support.rootless import (
    UserSession,
    end_the_users_processes,
    mount_namespace,
    rootless_user,
    share_rule,
)
from tests.support.sim_rig import Rig, running_rig
from tests.support.traffic import cdi_env

ADDRESS = "192.0.2.5/24"
PODMAN = (
    "podman --runtime runc --cgroup-manager cgroupfs --storage-driver vfs --events-backend file"
)


@pytest.fixture(scope="module")
def user() -> Iterator[Path]:
    with rootless_user() as home:
        yield home


@pytest.fixture
async def rig(tmp_path: Path) -> AsyncIterator[Rig]:
    """rdmad with sim devices, and polkitd under docs/rootless.md's rule, on a private bus."""
    with start_private_bus() as bus, start_polkitd(bus, share_rule("sim0")):
        async with running_rig(bus.address, tmp_path) as r:
            yield r


@pytest.fixture
async def podman(user: Path, rig: Rig) -> AsyncIterator[UserSession]:
    """The user's session; its pods and podman's processes end with the test."""
    with mount_namespace(rig.daemon.cdi_dir) as holder:
        session = UserSession(user, holder, rig.daemon.bus_address, PODMAN)
        try:
            yield session
        finally:
            await session.remove_pods()
            end_the_users_processes()


def device_nodes(rig: Rig, claim_id: str) -> list[dict[str, Any]]:
    spec = json.loads((rig.daemon.cdi_dir / f"rdmad.io-rdma-{claim_id}.json").read_text())
    nodes: list[dict[str, Any]] = spec["devices"][0]["containerEdits"]["deviceNodes"]
    return nodes


async def test_a_rootless_container_gets_the_users_share_through_cdi(
    podman: UserSession, rig: Rig
) -> None:
    claim = await podman.claim_into_a_pod("sim0", ADDRESS)
    nodes = device_nodes(rig, claim["id"])
    for node in nodes:
        podman.as_root("mknod", node["path"], "c", str(node["major"]), str(node["minor"]))
    inside = "ls /dev/infiniband; echo ==; env; echo ==; ip -o addr show dev net1"
    out = await podman.run_in_pod(inside, claim["cdi_device"])
    devices, env, addresses = out.split("==\n")
    assert sorted(devices.split()) == sorted(Path(n["path"]).name for n in nodes)
    seen = dict(line.split("=", 1) for line in env.splitlines() if "=" in line)
    assert cdi_env(rig.daemon.cdi_dir, claim["id"]).items() <= seen.items()
    assert f"inet {ADDRESS}" in addresses
    assert link(rig.nic("sim0")) is not None  # a share: the device's netdev stays on the host


async def test_the_user_releases_its_share_and_the_pod_loses_the_macvlan(
    podman: UserSession,
) -> None:
    claim = await podman.claim_into_a_pod("sim0", ADDRESS)
    assert ": net1@" in await podman.run_in_pod("ip -o link")  # before
    await podman.release(claim["id"])
    assert ": net1@" not in await podman.run_in_pod("ip -o link")
