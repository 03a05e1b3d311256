"""RDMA for a rootless container, as docs/rootless.md has a user do it: an unprivileged
user whom a polkit rule allows shares makes a rootless podman 4.3 pod, claims a share of a
sim device into the pod's netns with rdmactl, and runs a container given the claim by its
CDI name. The container sees the claim's char devices and env, and the macvlan with its
address; the user releases the claim again.

The test makes the user and its subordinate ids, and runs polkitd (tests/support/polkit.py)
and rdmad on a private bus. The user's commands run in a mount namespace of the test's
(`UserSession`): rdmad's CDI dir bound on /run/cdi (podman 4.3 reads only /etc/cdi and
/run/cdi), and a /dev whose /dev/infiniband the test fills with the nodes the claim's spec
names (a sim device has none; rootless runc bind-mounts each from the host). podman runs
with runc and cgroupfs, as on this machine kind's hybrid cgroups crun refuses to start.
"""

from __future__ import annotations

import asyncio
import json
import os
import pwd
import select
import shutil
import signal
import subprocess
import tempfile
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from testbed.bus import CALLER_PYTHON, caller_env, start_private_bus
from testbed.net import link
from tests.cni.podman import BUSYBOX, require_podman
from tests.support.polkit import start_polkitd
from tests.support.sim_rig import Rig, running_rig
from tests.support.traffic import cdi_env

USER = "rdmad-rootless"
SUBORDINATE = "524288-589823"  # 65536 ids for the user's namespace
ADDRESS = "192.0.2.5/24"
WAIT = 120
# The rule docs/rootless.md has the admin write: the user takes shares, releases its own.
RULE = f"""
polkit.addRule(function(action, subject) {{
    if ((action.id == "io.rdmad1.claim-share" || action.id == "io.rdmad1.release-own") &&
        subject.user == "{USER}")
        return polkit.Result.YES;
}});
"""
PODMAN = (
    "podman --runtime runc --cgroup-manager cgroupfs --storage-driver vfs --events-backend file"
)
# The mount namespace the user's commands run in ($0: rdmad's CDI dir); "ready" when set.
NAMESPACE = """set -e
mount -t tmpfs tmpfs /run
mkdir -p /run/cdi /run/dev/upper /run/dev/work /run/dev/host
mount --bind "$0" /run/cdi
mount --rbind /dev /run/dev/host
mount -t overlay overlay -o lowerdir=/dev,upperdir=/run/dev/upper,workdir=/run/dev/work /dev
for sub in pts shm mqueue hugepages; do
    if mountpoint -q /run/dev/host/$sub; then mount --rbind /run/dev/host/$sub /dev/$sub; fi
done
mkdir -p /dev/infiniband
echo ready
read _
"""


@dataclass
class UserSession:
    """The user's home, and a process holding the mount namespace its commands run in."""

    home: Path
    holder: subprocess.Popen[bytes]

    def enter(self) -> list[str]:
        return ["nsenter", f"--mount=/proc/{self.holder.pid}/ns/mnt", "--"]

    def as_root(self, *cmd: str) -> None:
        subprocess.run([*self.enter(), *cmd], check=True, timeout=WAIT)

    async def shell(self, script: str) -> str:
        """`script` (sh) as the user, in its session: its output; it must succeed."""
        env = {
            **caller_env(),
            "HOME": str(self.home),
            "XDG_RUNTIME_DIR": str(self.home / "run"),
            "PYTHON": CALLER_PYTHON,
            "PODMAN": PODMAN,
        }
        drop = ["setpriv", f"--reuid={USER}", f"--regid={USER}", "--init-groups"]
        proc = await asyncio.create_subprocess_exec(
            *self.enter(),
            *drop,
            "sh",
            "-ec",
            script,
            env=env,
            cwd=self.home,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        async with asyncio.timeout(WAIT):
            out, err = await proc.communicate()
        assert proc.returncode == 0, f"{script} failed ({proc.returncode}): {err.decode()}"
        return out.decode()


@pytest.fixture(scope="module")
def user() -> Iterator[Path]:
    """An unprivileged user with subordinate uids and gids: its home, with a busybox
    rootfs for its containers."""
    require_podman()
    require_rootless_tools()
    home = Path(tempfile.mkdtemp(prefix="rdmad-rl-"))
    home.chmod(0o755)
    no_automatic_ids = ["-K", "SUB_UID_COUNT=0", "-K", "SUB_GID_COUNT=0"]
    subprocess.run(
        ["useradd", *no_automatic_ids, "--home-dir", str(home), "--shell", "/bin/sh", USER],
        check=True,
    )
    subprocess.run(
        ["usermod", f"--add-subuids={SUBORDINATE}", f"--add-subgids={SUBORDINATE}", USER],
        check=True,
    )
    rootfs = home / "rootfs"
    for d in ("bin", "dev", "proc", "sys", "etc"):
        (rootfs / d).mkdir(parents=True)
    shutil.copy(BUSYBOX, rootfs / "bin" / "busybox")
    for applet in ("sh", "ls", "env", "ip"):
        (rootfs / "bin" / applet).symlink_to("busybox")
    subprocess.run(["chown", "-R", f"{USER}:{USER}", str(home)], check=True)
    try:
        yield home
    finally:
        end_the_users_processes()
        subprocess.run(["userdel", USER], check=True)
        shutil.rmtree(home, ignore_errors=True)


def require_rootless_tools() -> None:
    """uidmap and slirp4netns (scripts/bootstrap.sh): skip without them, fail under CI."""
    missing = [t for t in ("newuidmap", "newgidmap", "slirp4netns") if shutil.which(t) is None]
    if not missing:
        return
    if os.environ.get("CI") == "true":
        pytest.fail(f"missing {', '.join(missing)} (scripts/bootstrap.sh), and CI=true is set")
    pytest.skip(f"needs {', '.join(missing)}")


def end_the_users_processes() -> None:
    """What the user's podman left running (its pause process, which holds the user's
    namespaces; a pod's slirp4netns) ends with the test: killed, and waited for."""
    uid = pwd.getpwnam(USER).pw_uid
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            if proc.stat().st_uid != uid:
                continue
            pidfd = os.pidfd_open(int(proc.name))
        except (FileNotFoundError, ProcessLookupError):
            continue
        try:
            signal.pidfd_send_signal(pidfd, signal.SIGKILL)
            select.select([pidfd], [], [], WAIT)
        finally:
            os.close(pidfd)


@pytest.fixture
async def rig(tmp_path: Path) -> AsyncIterator[Rig]:
    """rdmad with sim devices, and polkitd under RULE, on a private bus."""
    with start_private_bus() as bus, start_polkitd(bus, RULE):
        async with running_rig(bus.address, tmp_path) as r:
            yield r


@pytest.fixture
def mount_namespace(rig: Rig) -> Iterator[subprocess.Popen[bytes]]:
    """A process holding the mount namespace of NAMESPACE, ready."""
    rig.daemon.cdi_dir.mkdir(parents=True, exist_ok=True)
    cmd = ["unshare", "--mount", "--propagation", "private", "sh", "-c", NAMESPACE]
    holder = subprocess.Popen(
        [*cmd, str(rig.daemon.cdi_dir)], stdin=subprocess.PIPE, stdout=subprocess.PIPE
    )
    assert holder.stdout is not None and holder.stdout.readline() == b"ready\n"
    try:
        yield holder
    finally:
        holder.communicate(b"\n", timeout=WAIT)


@pytest.fixture
async def podman(
    user: Path, mount_namespace: subprocess.Popen[bytes]
) -> AsyncIterator[UserSession]:
    """The user's session; its pods and podman's processes end with the test."""
    session = UserSession(user, mount_namespace)
    try:
        yield session
    finally:
        await session.shell("$PODMAN pod rm --all --force >/dev/null")
        end_the_users_processes()


# The user's steps, as docs/rootless.md has them.
POD = """
$PODMAN pod create --name rdma --infra-name rdma-infra >/dev/null
$PODMAN pod start rdma >/dev/null
pid=$($PODMAN inspect --format '{{.State.Pid}}' rdma-infra)
$PYTHON -m rdmad.cli.main --bus-address "$BUS" --json claim sim0 "pid:$pid" --shared \
    --address 192.0.2.5/24
"""
RUN = """
$PODMAN run --rm --pod rdma $DEVICE --rootfs "$HOME/rootfs" sh -c "$INSIDE"
"""


async def claim_into_the_pod(session: UserSession, rig: Rig) -> dict[str, Any]:
    """The pod made and its share claimed, by the user: rdmactl's JSON of the claim."""
    out = await session.shell(f"BUS='{rig.daemon.bus_address}'\n{POD}")
    claim: dict[str, Any] = json.loads(out)
    return claim


def device_nodes(rig: Rig, claim_id: str) -> list[dict[str, Any]]:
    spec = json.loads((rig.daemon.cdi_dir / f"rdmad.io-rdma-{claim_id}.json").read_text())
    nodes: list[dict[str, Any]] = spec["devices"][0]["containerEdits"]["deviceNodes"]
    return nodes


async def run_in_pod(session: UserSession, inside: str, cdi_device: str | None = None) -> str:
    """`inside` (sh) in a container of the pod, given `cdi_device`: its output."""
    device = f"--device={cdi_device}" if cdi_device else ""
    return await session.shell(f"DEVICE='{device}'\nINSIDE='{inside}'\n{RUN}")


async def test_a_rootless_container_gets_the_users_share_through_cdi(
    podman: UserSession, rig: Rig
) -> None:
    claim = await claim_into_the_pod(podman, rig)
    nodes = device_nodes(rig, claim["id"])
    for node in nodes:
        podman.as_root("mknod", node["path"], "c", str(node["major"]), str(node["minor"]))
    inside = "ls /dev/infiniband; echo ==; env; echo ==; ip -o addr show dev net1"
    devices, env, addresses = (await run_in_pod(podman, inside, claim["cdi_device"])).split("==\n")
    assert sorted(devices.split()) == sorted(Path(n["path"]).name for n in nodes)
    seen = dict(line.split("=", 1) for line in env.splitlines() if "=" in line)
    assert cdi_env(rig.daemon.cdi_dir, claim["id"]).items() <= seen.items()
    assert f"inet {ADDRESS}" in addresses
    assert link(rig.nic("sim0")) is not None  # a share: the device's netdev stays on the host


async def test_the_user_releases_its_share_and_the_pod_loses_the_macvlan(
    podman: UserSession, rig: Rig
) -> None:
    claim = await claim_into_the_pod(podman, rig)
    cmd = '$PYTHON -m rdmad.cli.main --bus-address "$BUS" release'
    assert ": net1@" in await run_in_pod(podman, "ip -o link")  # before
    await podman.shell(f"BUS='{rig.daemon.bus_address}'\n{cmd} {claim['id']}")
    assert ": net1@" not in await run_in_pod(podman, "ip -o link")
