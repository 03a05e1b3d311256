"""RDMA in a rootless container, 7.3 with rxe: an unprivileged user whom a polkit rule
allows shares of the rxe device makes a rootless podman 4.3 pod, claims a share into the
pod's netns with rdmactl and runs containers given the claim by its CDI name
(docs/rootless.md's steps; tests/support/rootless.py makes the user and runs them). Inside
the rootless container `ibv_devices` lists the device and `ib_write_bw` runs over loopback,
through the macvlan's RoCE GID.

rdmad and polkitd (docs/rootless.md's rule) share the module's private bus. podman runs
crun with cgroups disabled, as tests/guest/test_podman_cdi.py does (runc killed the guest);
the containers are a busybox rootfs with the host's /usr and libraries mounted read-only.
"""

from __future__ import annotations

import subprocess
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from testbed.bus import start_private_bus
from testbed.daemon import Client, RdmadProcess
from testbed.polkit import start_polkitd
from tests.guest.test_podman_cdi import PAIR, expand, pair_env, section
from tests.support.rdma import Rxe, known_to_rdmad, temp_rxe
from tests.support.rootless import (
    UserSession,
    end_the_users_processes,
    mount_namespace,
    rootless_user,
    share_rule,
)
from tests.support.traffic import WRITE_BW_ITERS, write_bw_iters

pytestmark = [
    pytest.mark.guest,
    pytest.mark.usefixtures("in_guest", "daemon_log_on_failure"),
]

ADDRESS = "192.0.2.30/24"
PODMAN = (
    "podman --runtime crun --cgroup-manager cgroupfs --storage-driver vfs --events-backend file"
)
RUN_FLAGS = (
    "--cgroups=disabled -v /usr:/usr:ro -v /lib:/lib:ro -v /lib64:/lib64:ro "
    "-v /etc/libibverbs.d:/etc/libibverbs.d:ro"
)


@pytest.fixture(scope="module")
def device() -> Iterator[Rxe]:
    """The module's rxe device: the one the rule names."""
    with temp_rxe() as dev:
        yield dev


@pytest.fixture(scope="module")
def bus_address(device: Rxe) -> Iterator[str]:
    """The module's bus, polkitd on it under docs/rootless.md's rule for `device`."""
    with start_private_bus() as bus, start_polkitd(bus, share_rule(device.name)):
        yield bus.address


@pytest.fixture(scope="module")
def user() -> Iterator[Path]:
    # slirp4netns, the rootless pod's network, opens /dev/net/tun: a node's boot loads tun,
    # the guest's does not
    subprocess.run(["modprobe", "tun"], check=True)
    with rootless_user() as home:
        yield home


@pytest.fixture(scope="module")
async def podman(user: Path, rdmad: RdmadProcess) -> AsyncIterator[UserSession]:
    """The user's session; its pod and podman's processes end with the module."""
    with mount_namespace(rdmad.cdi_dir) as holder:
        session = UserSession(user, holder, rdmad.bus_address, PODMAN, RUN_FLAGS)
        try:
            yield session
        finally:
            await session.remove_pods()
            end_the_users_processes()


@pytest.fixture(scope="module")
async def claim(podman: UserSession, client: Client, device: Rxe) -> dict[str, Any]:
    """The user's share of `device` in its pod: rdmactl's JSON of it."""
    await known_to_rdmad(client, device.name)
    return await podman.claim_into_a_pod(device.name, ADDRESS)


async def test_ibv_devices_lists_the_device_inside_the_rootless_container(
    podman: UserSession, claim: dict[str, Any], device: Rxe
) -> None:
    out = await podman.run_in_pod("ibv_devices", claim["cdi_device"])
    assert device.name in out.split(), out


async def test_ib_write_bw_runs_over_loopback_inside_the_rootless_container(
    podman: UserSession, claim: dict[str, Any]
) -> None:
    script = expand(PAIR, pair_env("ib_write_bw", WRITE_BW_ITERS))
    out = await podman.run_in_pod(script, claim["cdi_device"])
    both = (write_bw_iters(section(out, "server")), write_bw_iters(section(out, "client")))
    assert both == (WRITE_BW_ITERS, WRITE_BW_ITERS), out
