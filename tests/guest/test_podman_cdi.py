"""A real runtime consumes a claim's CDI spec: podman 4.3 (Debian bookworm) with crun, 7.3.

The container joins the claimant's netns (`--network ns:PATH`) and gets the claim's device
by its CDI name (`--device rdmad.io/rdma=ID`), from the very spec file rdmad wrote: rdmad's
CDI dir is bind-mounted on /etc/cdi, where podman looks. The image is a busybox rootfs with
the host's /usr and libraries mounted read-only (`--rootfs /` fails: pivot_root is busy).
A shared claim: in shared mode every netns sees every RDMA device, so the isolation is the
char devices the runtime injects, which the negative control shows.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import subprocess
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from dbus_fast import Variant

from testbed.daemon import Client, DBusCallError, RdmadProcess
from tests.support.rdma import CLAIM_IFACE, WAIT, Rxe, all_props, known_to_rdmad, sh
from tests.support.traffic import (
    PINGPONG_ITERS,
    WRITE_BW_ITERS,
    cdi_env,
    pingpong_iters,
    write_bw_iters,
)

pytestmark = [
    pytest.mark.guest,
    pytest.mark.usefixtures("in_guest", "daemon_log_on_failure"),
]

CDI_SPEC_DIR = Path("/etc/cdi")
TOOLS = ("sh", "env", "ls", "cat", "grep", "sleep")
# busybox sh inside the container: a server in the background, its client retried until the
# server listens (the tools print nothing when they do), then both ends' output.
PAIR = """
$SERVER > /tmp/server 2>&1 &
until $CLIENT 127.0.0.1 > /tmp/client 2>&1 || ! grep -q "Couldn't connect" /tmp/client; do :; done
wait
echo "== server"; cat /tmp/server; echo "== client"; cat /tmp/client
"""


@pytest.fixture(scope="module")
def rootfs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A busybox root with mount points for the host's /usr, /lib, /lib64 and verbs drivers."""
    root = tmp_path_factory.mktemp("rootfs")
    for d in ("bin", "dev", "proc", "sys", "usr", "lib", "lib64", "tmp", "etc/libibverbs.d"):
        (root / d).mkdir(parents=True)
    shutil.copy("/bin/busybox", root / "bin/busybox")
    for tool in TOOLS:
        (root / "bin" / tool).symlink_to("busybox")
    (root / "etc/passwd").write_text("root:x:0:0:root:/:/bin/sh\n")
    return root


@pytest.fixture(scope="module")
def podman_state() -> Iterator[Path]:
    """podman's --root and --runroot parent: short (podman refuses a runroot over 50
    characters, which pytest's tmp paths are)."""
    path = Path(tempfile.mkdtemp(prefix="pm", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="module")
def cdi_dir_seen_by_podman(rdmad: RdmadProcess) -> Iterator[None]:
    rdmad.cdi_dir.mkdir(parents=True, exist_ok=True)
    CDI_SPEC_DIR.mkdir(parents=True, exist_ok=True)
    sh("mount", "--bind", str(rdmad.cdi_dir), str(CDI_SPEC_DIR))
    try:
        yield
    finally:
        sh("umount", str(CDI_SPEC_DIR), check=False)


@pytest.fixture
async def claim(
    client: Client, rdmad: RdmadProcess, netns: str, rxe: Rxe, cdi_dir_seen_by_podman: None
) -> AsyncIterator[dict[str, object]]:
    """A shared claim of `rxe` into `netns` with an address; released afterwards."""
    await known_to_rdmad(client, rxe.name)
    opts = {
        "shared": Variant("b", True),
        "ifname": Variant("s", "net1"),
        "addresses": Variant("as", ["192.0.2.20/24"]),
    }
    path = await client.manager("Claim", "ssa{sv}", rxe.name, netns, opts)
    props = await all_props(client, str(path), CLAIM_IFACE)
    yield props
    with contextlib.suppress(DBusCallError):
        await client.manager("Release", "s", props["Id"])


async def podman(
    rootfs: Path, state: Path, netns: str, script: str, *extra: str, env: dict[str, str]
) -> str:
    """`podman run` of `script` (busybox sh) in `netns`; its output, whatever its status."""
    cmd = [
        "podman",
        "--root", str(state / "root"),
        "--runroot", str(state / "run"),
        "--storage-driver", "vfs",
        "--cgroup-manager", "cgroupfs",
        "--events-backend", "none",
        "--runtime", "crun",
        "run", "--rm", "--cgroups=disabled",
        "--network", f"ns:/run/netns/{netns}",
        "-v", "/usr:/usr:ro", "-v", "/lib:/lib:ro", "-v", "/lib64:/lib64:ro",
        "-v", "/etc/libibverbs.d:/etc/libibverbs.d:ro",
        *[f"--env={k}={v}" for k, v in env.items()],
        *extra,
        "--rootfs", str(rootfs),
        "sh", "-c", script,
    ]  # fmt: skip
    proc = await asyncio.create_subprocess_exec(
        *cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
    )
    out, _ = await asyncio.wait_for(proc.communicate(), 3 * WAIT)
    return out.decode()


def section(out: str, name: str) -> str:
    """The output after "== NAME" up to the next "== " marker."""
    _, _, rest = out.partition(f"== {name}\n")
    return rest.split("\n== ", 1)[0]


def pair_env(tool: str, iters: int) -> dict[str, str]:
    """SERVER and CLIENT for PAIR, naming the device and GID by the env the spec gave."""
    gid_flag = "-g" if tool == "ibv_rc_pingpong" else "-x"
    extra = "" if tool == "ibv_rc_pingpong" else " -F"
    base = f"{tool}{extra} -d $RDMAD_DEVICE {gid_flag} $RDMAD_GID_INDEX -n {iters}"
    return {"SERVER": base, "CLIENT": base}


def expand(script: str, env: dict[str, str]) -> str:
    """PAIR with SERVER/CLIENT put in as text: the container's shell expands the rest."""
    for key, value in env.items():
        script = script.replace(f"${key}", value)
    return script


async def test_the_container_gets_exactly_the_claims_char_devices_and_env(
    rootfs: Path, podman_state: Path, netns: str, claim: dict[str, object], rdmad: RdmadProcess
) -> None:
    out = await podman(
        rootfs,
        podman_state,
        netns,
        "echo '== dev'; ls /dev/infiniband; echo '== env'; env",
        f"--device={claim['CdiDevice']}",
        env={},
    )
    nodes = claim["CharDevices"]
    assert isinstance(nodes, list)
    assert section(out, "dev").split() == sorted(os.path.basename(p) for p, _, _ in nodes), out
    seen = dict(line.split("=", 1) for line in section(out, "env").splitlines() if "=" in line)
    for key, value in cdi_env(rdmad.cdi_dir, str(claim["Id"])).items():
        assert seen.get(key) == value, out


async def test_ibv_rc_pingpong_runs_inside_the_container(
    rootfs: Path, podman_state: Path, netns: str, claim: dict[str, object]
) -> None:
    script = expand(PAIR, pair_env("ibv_rc_pingpong", PINGPONG_ITERS))
    sh("ip", "link", "set", "lo", "up", netns=netns)
    out = await podman(
        rootfs, podman_state, netns, script, f"--device={claim['CdiDevice']}", env={}
    )
    both = (pingpong_iters(section(out, "server")), pingpong_iters(section(out, "client")))
    assert both == (PINGPONG_ITERS, PINGPONG_ITERS), out


async def test_ib_write_bw_runs_inside_the_container(
    rootfs: Path, podman_state: Path, netns: str, claim: dict[str, object]
) -> None:
    script = expand(PAIR, pair_env("ib_write_bw", WRITE_BW_ITERS))
    sh("ip", "link", "set", "lo", "up", netns=netns)
    out = await podman(
        rootfs, podman_state, netns, script, f"--device={claim['CdiDevice']}", env={}
    )
    both = (write_bw_iters(section(out, "server")), write_bw_iters(section(out, "client")))
    assert both == (WRITE_BW_ITERS, WRITE_BW_ITERS), out


async def test_without_the_device_the_container_cannot_open_it(
    rootfs: Path, podman_state: Path, netns: str, claim: dict[str, object], rdmad: RdmadProcess
) -> None:
    env = cdi_env(rdmad.cdi_dir, str(claim["Id"]))  # the same values, given by hand
    script = (
        "echo '== dev'; ls /dev/infiniband 2>&1; echo '== run'; "
        "ibv_rc_pingpong -d $RDMAD_DEVICE -g $RDMAD_GID_INDEX -n 10 127.0.0.1 2>&1"
    )
    out = await podman(rootfs, podman_state, netns, script, env=env)
    assert "No such file or directory" in section(out, "dev"), out
    run = section(out, "run")
    assert f"IB device {env['RDMAD_DEVICE']} not found" in run, out
    assert pingpong_iters(run) is None, out
