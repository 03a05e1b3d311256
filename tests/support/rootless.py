"""An unprivileged user with rootless podman 4.3, for the tests of docs/rootless.md: the
user and its subordinate ids, made by the test (`rootless_user`); a polkit rule letting it
take shares (`share_rule`); the mount namespace its commands run in (`mount_namespace`:
rdmad's CDI dir bound on /run/cdi, where podman 4.3 looks, and a /dev of its own); and its
session (`UserSession`), which runs the user's steps as docs/rootless.md has them.

The user's client is rdmactl run by Debian's python3 with the project on PYTHONPATH
(testbed.bus.caller_env): the venv's interpreter may sit under /root, which the user
cannot run. Without uidmap or slirp4netns (scripts/bootstrap.sh) the tests skip, except
under CI=true: then they fail.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import pwd
import select
import shutil
import signal
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from testbed.bus import CALLER_PYTHON, caller_env

USER = "rdmad-rootless"
UID = 64123  # the user's uid and gid: Debian's range for its own allocations, unused
SUBORDINATE = "524288:65536"  # the ids of the user's namespace: first, count
WAIT = 600  # s: a rootless podman command under emulation (the guest) takes minutes
BUSYBOX = Path("/bin/busybox")
APPLETS = ("sh", "ls", "env", "ip", "cat", "grep")
# The mount namespace the user's commands run in ($0: rdmad's CDI dir); "ready" when set.
# /dev is an overlay, so that a test may add the nodes a sim device's spec names.
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
# The user's steps, as docs/rootless.md has them ($DEVICE: the RDMA device to share).
POD = """
$PODMAN pod create --name rdma --infra-name rdma-infra >/dev/null
$PODMAN pod start rdma >/dev/null
pid=$($PODMAN inspect --format '{{.State.Pid}}' rdma-infra)
$PYTHON -m rdmad.cli.main --bus-address "$BUS" --json claim "$DEVICE" "pid:$pid" --shared \
    --address "$ADDRESS"
"""
RUN = """
$PODMAN run --rm --pod rdma $FLAGS --rootfs "$HOME/rootfs" sh -c "$INSIDE"
"""
RELEASE = """
$PYTHON -m rdmad.cli.main --bus-address "$BUS" release "$CLAIM"
"""


def share_rule(device: str) -> str:
    """docs/rootless.md's rule: USER takes shares of `device`, and releases its own."""
    return f"""
polkit.addRule(function(action, subject) {{
    if (subject.user != "{USER}")
        return polkit.Result.NOT_HANDLED;
    if (action.id == "io.rdmad1.claim-share" && action.lookup("device") == "{device}")
        return polkit.Result.YES;
    if (action.id == "io.rdmad1.release-own")
        return polkit.Result.YES;
    return polkit.Result.NOT_HANDLED;
}});
"""


def require_rootless_tools() -> None:
    """podman, uidmap and slirp4netns: skip without them, fail under CI=true."""
    tools = ("podman", "newuidmap", "newgidmap", "slirp4netns")
    missing = [t for t in tools if shutil.which(t) is None]
    if not missing:
        return
    if os.environ.get("CI") == "true":
        pytest.fail(f"missing {', '.join(missing)} (scripts/bootstrap.sh), and CI=true is set")
    pytest.skip(f"needs {', '.join(missing)}")


@contextlib.contextmanager
def _account(home: Path) -> Iterator[None]:
    """USER's lines in the account files meanwhile, written as useradd and usermod would
    (which fail on the guest's overlaid /etc): no shadow entry, no one logs in as it."""
    lines = {
        "/etc/passwd": f"{USER}:x:{UID}:{UID}::{home}:/bin/sh",
        "/etc/group": f"{USER}:x:{UID}:",
        "/etc/subuid": f"{USER}:{SUBORDINATE}",
        "/etc/subgid": f"{USER}:{SUBORDINATE}",
    }
    assert UID not in {u.pw_uid for u in pwd.getpwall()}, f"uid {UID} is taken"
    try:
        for path, line in lines.items():
            with open(path, "a") as f:
                f.write(line + "\n")
        yield
    finally:
        for path in lines:
            kept = [x for x in Path(path).read_text().splitlines() if not x.startswith(f"{USER}:")]
            Path(path).write_text("".join(x + "\n" for x in kept))


@contextlib.contextmanager
def rootless_user() -> Iterator[Path]:
    """USER with subordinate uids and gids: its home, with a busybox rootfs for its
    containers. Gone afterwards, with whatever of its podman still runs."""
    require_rootless_tools()
    home = Path(tempfile.mkdtemp(prefix="rdmad-rl-"))
    home.chmod(0o755)
    try:
        with _account(home):
            rootfs = home / "rootfs"
            for d in (
                "bin",
                "dev",
                "proc",
                "sys",
                "tmp",
                "usr",
                "lib",
                "lib64",
                "etc/libibverbs.d",
            ):
                (rootfs / d).mkdir(parents=True)
            shutil.copy(BUSYBOX, rootfs / "bin" / "busybox")
            for applet in APPLETS:
                (rootfs / "bin" / applet).symlink_to("busybox")
            subprocess.run(["chown", "-R", f"{UID}:{UID}", str(home)], check=True)
            try:
                yield home
            finally:
                end_the_users_processes()
    finally:
        shutil.rmtree(home, ignore_errors=True)


def end_the_users_processes() -> None:
    """What the user's podman left running (its pause process, which holds the user's
    namespaces; a pod's slirp4netns) ends: killed (catatonit ignores SIGTERM), waited for."""
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            if proc.stat().st_uid != UID:
                continue
            pidfd = os.pidfd_open(int(proc.name))
        except (FileNotFoundError, ProcessLookupError):
            continue
        try:
            signal.pidfd_send_signal(pidfd, signal.SIGKILL)
            select.select([pidfd], [], [], WAIT)
        finally:
            os.close(pidfd)


@contextlib.contextmanager
def mount_namespace(cdi_dir: Path) -> Iterator[subprocess.Popen[bytes]]:
    """A process holding the mount namespace of NAMESPACE, ready."""
    cdi_dir.mkdir(parents=True, exist_ok=True)
    cmd = ["unshare", "--mount", "--propagation", "private", "sh", "-c", NAMESPACE]
    holder = subprocess.Popen([*cmd, str(cdi_dir)], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    assert holder.stdout is not None and holder.stdout.readline() == b"ready\n"
    try:
        yield holder
    finally:
        holder.communicate(b"\n", timeout=WAIT)


@dataclass
class UserSession:
    """USER's commands, in the mount namespace `holder` holds, on rdmad's bus `bus`, with
    `podman` (the command and its global flags) and `run_flags` for each `podman run`."""

    home: Path
    holder: subprocess.Popen[bytes]
    bus: str
    podman: str
    run_flags: str = ""

    def enter(self) -> list[str]:
        return ["nsenter", f"--mount=/proc/{self.holder.pid}/ns/mnt", "--"]

    def as_root(self, *cmd: str) -> None:
        subprocess.run([*self.enter(), *cmd], check=True, timeout=WAIT)

    async def shell(self, script: str, **env: str) -> str:
        """`script` (sh) as the user, with `env`: its output; it must succeed."""
        full = {
            **caller_env(),
            "HOME": str(self.home),
            "XDG_RUNTIME_DIR": str(self.home / "run"),
            "PYTHON": CALLER_PYTHON,
            "PODMAN": self.podman,
            "BUS": self.bus,
            **env,
        }
        drop = ["setpriv", f"--reuid={USER}", f"--regid={USER}", "--init-groups"]
        proc = await asyncio.create_subprocess_exec(
            *self.enter(),
            *drop,
            *("sh", "-ec", script),
            env=full,
            cwd=self.home,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        async with asyncio.timeout(WAIT):
            out, err = await proc.communicate()
        assert proc.returncode == 0, f"{script} failed ({proc.returncode}): {err.decode()}"
        return out.decode()

    async def claim_into_a_pod(self, device: str, address: str) -> dict[str, Any]:
        """The pod made and a share of `device` claimed into it: rdmactl's JSON of it."""
        claim: dict[str, Any] = json.loads(await self.shell(POD, DEVICE=device, ADDRESS=address))
        return claim

    async def run_in_pod(self, inside: str, cdi_device: str | None = None) -> str:
        """`inside` (sh) in a container of the pod, given `cdi_device`: its output."""
        flags = f"{self.run_flags} --device={cdi_device}" if cdi_device else self.run_flags
        return await self.shell(RUN, FLAGS=flags, INSIDE=inside)

    async def release(self, claim_id: str) -> None:
        await self.shell(RELEASE, CLAIM=claim_id)

    async def remove_pods(self) -> None:
        await self.shell("$PODMAN pod rm --all --force >/dev/null")
