"""CDI as a runtime applies it: the real podman 4.3 injects the specs of a pod's claims
into one container, in either order, and the container sees the pod-wide env, each key
once; the pod CDI name injects every device of the pod with one --device.

podman 4.3 reads CDI specs from /etc/cdi and /var/run/cdi only (no cdi_spec_dirs yet), so
each podman runs in a mount namespace of its own with rdmad's CDI dir bound on /run/cdi
(over a tmpfs on /run: nothing of the host's /etc or /run changes). The container needs no
network: rdmad's claims are made into a netns of the test's."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from dbus_fast import Variant

from tests.cni.podman import Podman, require_podman
from tests.support.sim_rig import Rig, running_rig

CLAIM_IFACE = "io.rdmad1.Claim"
RAILS = {"sim0": False, "sim1": False, "sim2": True, "sim3": True}  # device -> shared
# Mounts a tmpfs on /run, rdmad's CDI dir ($0) on /run/cdi, then runs podman ("$@").
IN_OWN_MOUNTS = (
    'mount -t tmpfs tmpfs /run && mkdir /run/cdi && mount --bind "$0" /run/cdi && exec "$@"'
)


@pytest.fixture
async def rig(bus_address: str, tmp_path: Path) -> AsyncIterator[Rig]:
    async with running_rig(bus_address, tmp_path, devices=len(RAILS)) as r:
        yield r


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
        shutil.rmtree(home, ignore_errors=True)


async def claim_pod(rig: Rig, netns: str) -> list[str]:
    """The 4 rails' claims (2 whole-device, 2 shared), into `netns`: their ids."""
    ids = []
    for n, (device, shared) in enumerate(RAILS.items()):
        options = {"ifname": Variant("s", f"net{n}"), "pod_cdi_name": Variant("s", "pod1")}
        if shared:
            options["shared"] = Variant("b", True)
            options["addresses"] = Variant("as", [f"10.0.{n}.5/24"])
        path = await rig.client.manager("Claim", "ssa{sv}", device, netns, options)
        ids.append(await rig.client.prop(path, CLAIM_IFACE, "Id"))
    return ids


def run_with_devices(pm: Podman, cdi_dir: Path, names: list[str], script: str) -> str:
    """`script` in a container given the CDI devices `names`, in that order: its output."""
    devices = [f"--device=rdmad.io/rdma={name}" for name in names]
    podman = ["podman", "--root", str(pm.home / "storage"), "--runroot", str(pm.home / "run")]
    cmd = [
        *("unshare", "--mount", "--propagation", "private", "sh", "-c", IN_OWN_MOUNTS),
        str(cdi_dir),
        *(*podman, "--storage-driver", "vfs", "run", "--rm", "--network", "none"),
        *devices,
        *("--rootfs", str(pm.rootfs), "/bin/busybox", "sh", "-c", script),
    ]
    env = {**os.environ, "CONTAINERS_CONF": str(pm.home / "containers.conf")}
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0, f"{' '.join(cmd)} failed ({done.returncode}): {done.stderr}"
    return done.stdout


def pod_env(rig: Rig, claim_id: str) -> list[str]:
    path = rig.daemon.cdi_dir / f"rdmad.io-rdma-{claim_id}.json"
    env: list[str] = json.loads(path.read_text())["devices"][0]["containerEdits"]["env"]
    return env


@pytest.mark.parametrize("order", ["as-claimed", "reversed"])
async def test_a_container_given_the_pods_specs_sees_the_pod_wide_env_once(
    rig: Rig, netns: str, podman: Podman, order: str
) -> None:
    ids = await claim_pod(rig, netns)
    names = ids if order == "as-claimed" else ids[::-1]
    lines = run_with_devices(podman, rig.daemon.cdi_dir, names, "/bin/busybox env").splitlines()
    wanted = pod_env(rig, ids[0])
    assert "NCCL_IB_HCA==sim0:1,sim1:1,sim2:1,sim3:1" in wanted
    for entry in wanted:
        key = entry.split("=", 1)[0]
        assert [line for line in lines if line.startswith(f"{key}=")] == [entry]


async def test_the_pod_cdi_name_injects_every_device_of_the_pod(
    rig: Rig, netns: str, podman: Podman
) -> None:
    ids = await claim_pod(rig, netns)
    script = "/bin/busybox env; /bin/busybox ls /dev/infiniband"
    lines = run_with_devices(podman, rig.daemon.cdi_dir, ["pod1"], script).splitlines()
    nodes = {
        Path(n["path"]).name
        for cid in ids
        for n in json.loads((rig.daemon.cdi_dir / f"rdmad.io-rdma-{cid}.json").read_text())[
            "devices"
        ][0]["containerEdits"]["deviceNodes"]
    }
    assert len(nodes) == len(RAILS) + 1  # a uverbs node each, and the one rdma_cm
    assert nodes <= set(lines)
    assert set(pod_env(rig, ids[0])) <= set(lines)
