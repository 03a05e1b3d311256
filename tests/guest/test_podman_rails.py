"""A multi-rail pod on the real kernel (issue 27): 4 rxe rails in one podman pod, 7.3 guest.

podman 4.3 (CNI backend, crun) starts a pod with 4 rdmad-cni attachments, one rxe device
each on a veth of its own: shared (a macvlan child each, on one subnet, `policyRouting`) and
whole-device (exclusive mode, `netdev: false`: the rxe moves, its veth stays home). A fifth
rxe device, in no attachment, is the bystander. One container of the pod gets every rail by
the pod's CDI name (`rdmad.io/rdma=<pod>`, rdmad-cni's `pod_cdi_name`), lists its devices,
and runs `ib_write_bw` on each rail it finds in its own env (`NCCL_IB_HCA`,
`RDMAD_GID_INDEXES`): server and client in the pod's netns over 127.0.0.1 (soft-RoCE carries
no traffic between netns, docs/kernel-notes.md). `rdma statistic`, read in the pod's netns
before and after, shows what each rail carried.

The pod runs once per mode (module fixture `pod`); each test checks one thing of that run.
podman runs in the 7.3 guest only (issue 19), and 6.1's rxe cannot change netns: the 6.1
run checks that the pod's whole-device claims are refused there and nothing moves.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from dbus_fast import Variant

from testbed.daemon import Client, DBusCallError, RdmadProcess
from testbed.net import eventually, temp_netns
from tests.cni.podman import Podman
from tests.support.rdma import (
    WAIT,
    Rxe,
    kernel,
    known_to_rdmad,
    listed,
    rdma_dev_names,
    rdma_json,
    set_netns_mode,
    sh,
    temp_rxe,
)
from tests.support.traffic import WRITE_BW_ITERS, write_bw_row

pytestmark = [pytest.mark.guest, pytest.mark.usefixtures("in_guest", "daemon_log_on_failure")]

only_61 = pytest.mark.skipif(
    kernel() != "6.1", reason="the 6.1 branch: 7.3's rxe changes netns (the pod above)"
)

RAILS = 4  # as issue 27 asks of the real kernel (the bench runs 8)
POD = "trainer"
SUBNET = "192.0.2"  # every rail on one subnet: the case the main table gets wrong
PEER = f"{SUBNET}.99"
CDI_SPEC_DIR = Path("/etc/cdi")  # where podman 4.3 looks (no cdi_spec_dirs yet)
APPLETS = ("env", "grep", "tr")  # besides the Podman rootfs's sh, cat, ls, ...
HOST_MOUNTS = ("/usr", "/lib", "/lib64", "/etc/libibverbs.d")  # rdma-core and perftest
# busybox sh in the container: its env, its devices, then an ib_write_bw pair on each rail of
# NCCL_IB_HCA (=dev:port,dev:port,...) with that rail's entry of RDMAD_GID_INDEXES; a client
# is started again until its server listens (the tool prints nothing when it does). A pair
# that fails prints the GID entry it used, for the failure report.
SCRIPT = """
echo "== env"; env
echo "== devices"; ibv_devices
set -- $(echo "$RDMAD_GID_INDEXES" | tr , ' ')
for rail in $(echo "${NCCL_IB_HCA#=}" | tr , ' '); do
    dev=${rail%:*}; port=${rail#*:}; gid=$1; shift
    bw="ib_write_bw -F -d $dev -i $port -x $gid -n ITERS"
    $bw > /tmp/server 2>&1 &
    until $bw 127.0.0.1 > /tmp/client 2>&1 || ! grep -q "Couldn't connect" /tmp/client; do :; done
    wait
    echo "== server $dev"; cat /tmp/server; echo "== client $dev"; cat /tmp/client
    grep -q "#bytes" /tmp/client && continue
    sys=/sys/class/infiniband/$dev/ports/$port  # the GID entry, as the container saw it after
    echo "== gid $dev"; cat $sys/gids/$gid $sys/gid_attrs/types/$gid $sys/gid_attrs/ndevs/$gid 2>&1
done
""".replace("ITERS", str(WRITE_BW_ITERS))

Counters = dict[str, int]


@dataclass(frozen=True)
class PodRun:
    """What one run of the pod's container left to check."""

    rails: list[Rxe]
    bystander: Rxe
    claims: list[tuple[str, str]]  # (device, interface name) of the pod's claims
    netns: str  # the pod's netns: its NAME under /run/netns (podman's CNI netns)
    out: str  # the container's output
    before: dict[str, Counters]  # rdma statistic per device, before the container ran
    after: dict[str, Counters]

    def env(self) -> dict[str, str]:
        return dict(line.split("=", 1) for line in section(self.out, "env").splitlines())

    def pod_order(self) -> list[str]:
        """The rails as rdmad orders them: by interface name in the pod, then device."""
        return [device for device, _ in sorted(self.claims, key=lambda c: (c[1], c[0]))]


def section(out: str, name: str) -> str:
    """The output after "== NAME" up to the next "== " marker."""
    _, _, rest = out.partition(f"== {name}\n")
    return rest.split("\n== ", 1)[0]


def counters(device: str, netns: str | None) -> Counters:
    """`rdma statistic` of the device's port 1, read in `netns`."""
    (row,) = rdma_json("statistic", "show", "link", f"{device}/1", netns=netns)
    return {k: v for k, v in row.items() if isinstance(v, int)}


def podman(pm: Podman, *args: str, check: bool = True) -> str:
    """podman with the Podman helper's storage and config, under the guest's slow clock."""
    cmd = ["podman", "--root", str(pm.home / "storage"), "--runroot", str(pm.home / "run")]
    env = {**os.environ, "CONTAINERS_CONF": str(pm.home / "containers.conf")}
    done = subprocess.run(
        [*cmd, "--storage-driver", "vfs", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=5 * WAIT,
    )
    assert done.returncode == 0 or not check, (
        f"podman {' '.join(args)} failed: {done.stdout}{done.stderr}"
    )
    return done.stdout


@contextlib.contextmanager
def rxe_devices(count: int) -> Iterator[list[Rxe]]:
    with contextlib.ExitStack() as stack:
        yield [stack.enter_context(temp_rxe("rl")) for _ in range(count)]


@contextlib.contextmanager
def cdi_dir_seen_by_podman(rdmad: RdmadProcess) -> Iterator[None]:
    rdmad.cdi_dir.mkdir(parents=True, exist_ok=True)
    CDI_SPEC_DIR.mkdir(parents=True, exist_ok=True)
    sh("mount", "--bind", str(rdmad.cdi_dir), str(CDI_SPEC_DIR))
    try:
        yield
    finally:
        sh("umount", str(CDI_SPEC_DIR), check=False)


@contextlib.contextmanager
def podman_home() -> Iterator[Podman]:
    """A Podman set-up (crun, cgroups off for every container, the infra one included: the
    guest's cgroups refuse them) with the tools this module's container runs."""
    home = Path(sh("mktemp", "-d", "/tmp/prXXXX").strip())  # podman: runroot <= 50 chars
    pm = Podman(home, runtime="crun")
    pm.setup()
    conf = home / "containers.conf"
    conf.write_text(
        conf.read_text().replace("[containers]\n", '[containers]\ncgroups = "disabled"\n')
    )
    for applet in APPLETS:
        (pm.rootfs / "bin" / applet).symlink_to("busybox")
    for d in (*HOST_MOUNTS, "/tmp", "/dev", "/proc", "/sys"):
        (pm.rootfs / d.lstrip("/")).mkdir(parents=True, exist_ok=True)
    try:
        yield pm
    finally:
        podman(pm, "pod", "rm", "-a", "-f", "-t", "0", check=False)
        sh("rm", "-rf", str(home), check=False)


def rail_network(rdmad: RdmadProcess, rail: Rxe, n: int, mode: str) -> dict[str, Any]:
    plugin = {"type": "rdmad", "device": rail.name, "busAddress": rdmad.bus_address}
    if mode == "exclusive":
        return {**plugin, "netdev": False}
    ipam = {"type": "static", "addresses": [{"address": f"{SUBNET}.{10 + n}/24"}]}
    return {**plugin, "shared": True, "policyRouting": True, "ipam": ipam}


def released(claim_id: str) -> Callable[[list[Any]], bool]:
    return lambda body: bool(body[0] == claim_id)


async def dad_done(netdev: str) -> None:
    """Until `netdev` has a link-local address that passed DAD: ib_write_bw's move of a QP to
    RTR resolves the GID's address through the netdev, which must own it by then."""

    def settled() -> bool:
        out = subprocess.run(
            ["ip", "-6", "-o", "addr", "show", "dev", netdev, "scope", "link", "-tentative"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        return out.strip() != ""

    await eventually(settled, 10, f"{netdev}'s IPv6 DAD")


@pytest.fixture(scope="module")
async def devices(client: Client) -> AsyncIterator[list[Rxe]]:
    """The rails and the bystander (the last), made once for both modes' pods: rdmad lists
    each, and each netdev's link-local address passed DAD."""
    with rxe_devices(RAILS + 1) as made:
        for rxe in made:
            await known_to_rdmad(client, rxe.name)
            await dad_done(rxe.netdev)
        yield made


@pytest.fixture(scope="module")
def pm(rdmad: RdmadProcess) -> Iterator[Podman]:
    """One podman home for both modes' pods (its storage and pause image made once), with
    rdmad's CDI specs where podman reads them."""
    with cdi_dir_seen_by_podman(rdmad), podman_home() as home:
        yield home


@contextlib.asynccontextmanager
async def running_pod(
    client: Client, rdmad: RdmadProcess, pm: Podman, devices: list[Rxe], mode: str
) -> AsyncIterator[PodRun]:
    """The pod with its rails in `mode`, after its container ran; removed afterwards."""
    rails, bystander = devices[:RAILS], devices[RAILS]
    flags = []
    for n, rail in enumerate(rails):
        pm.add_network(f"rail{n}", rail_network(rdmad, rail, n, mode))
        flags += ["--network", f"rail{n}"]
    podman(pm, "pod", "create", "--name", POD, *flags)
    podman(pm, "pod", "start", POD)  # the infra container: a CNI ADD per rail
    infra = podman(pm, "pod", "inspect", "--format", "{{.InfraContainerID}}", POD).strip()
    sandbox = podman(pm, "inspect", "--format", "{{.NetworkSettings.SandboxKey}}", infra)
    netns = Path(sandbox.strip()).name
    sh("ip", "link", "set", "lo", "up", netns=netns)
    rows = await client.manager("ListClaims")
    ids = [cid for cid, *_ in rows]
    claims = [(device, ifname) for _, device, _, ifname, _, _ in rows]
    before = {rxe.name: counters(rxe.name, netns) for rxe in rails}
    before[bystander.name] = counters(bystander.name, None)
    mounts = [f"--volume={d}:{d}:ro" for d in HOST_MOUNTS]
    out = podman(
        pm, "run", "--rm", "--pod", POD, *mounts,
        f"--device=rdmad.io/rdma={POD}", "--rootfs", str(pm.rootfs), "sh", "-c", SCRIPT,
    )  # fmt: skip
    after = {rxe.name: counters(rxe.name, netns) for rxe in rails}
    after[bystander.name] = counters(bystander.name, None)
    yield PodRun(rails, bystander, claims, netns, out, before, after)
    mark = client.mark()
    podman(pm, "pod", "rm", "-f", "-t", "0", POD)  # the CNI DELs: every claim ends
    for cid in ids:
        await client.wait_signal("Released", released(cid), WAIT, since=mark)
    assert await client.manager("ListClaims") == []


@pytest.fixture(scope="module", params=["shared", "exclusive"])
async def pod(
    request: pytest.FixtureRequest,
    client: Client,
    rdmad: RdmadProcess,
    pm: Podman,
    devices: list[Rxe],
) -> AsyncIterator[PodRun]:
    mode: str = request.param
    await set_netns_mode(client, mode)
    try:
        async with running_pod(client, rdmad, pm, devices, mode) as run:
            yield run
    finally:
        await set_netns_mode(client, "shared")


async def test_the_pod_has_one_claim_per_rail(pod: PodRun) -> None:
    assert sorted(device for device, _ in pod.claims) == sorted(r.name for r in pod.rails)


async def test_the_containers_env_names_every_rail_once_in_pod_order(pod: PodRun) -> None:
    env, rails = pod.env(), pod.pod_order()
    assert env["RDMAD_DEVICES"] == ",".join(rails), pod.out
    assert env["NCCL_IB_HCA"] == "=" + ",".join(f"{r}:1" for r in rails), pod.out
    assert len(env["RDMAD_GID_INDEXES"].split(",")) == RAILS, pod.out


async def test_ibv_devices_in_the_container_lists_exactly_the_pods_rails(pod: PodRun) -> None:
    lines = section(pod.out, "devices").splitlines()[2:]  # past the two header lines
    assert {line.split()[0] for line in lines if line.strip()} == set(pod.pod_order()), pod.out


async def test_ib_write_bw_runs_on_each_rail_by_the_envs_names(pod: PodRun) -> None:
    for rail in pod.pod_order():
        for end in ("server", "client"):
            out = section(pod.out, f"{end} {rail}")
            row = write_bw_row(out)
            assert row is not None and row[1] == WRITE_BW_ITERS, pod.out
            assert re.search(rf"Device\s*:\s*{rail}\b", out), f"{end} not on {rail}:\n{out}"


async def test_rdma_statistic_shows_each_rail_carried_its_own_traffic(pod: PodRun) -> None:
    for rail in pod.pod_order():
        row = write_bw_row(section(pod.out, f"client {rail}"))
        assert row is not None, pod.out
        moved = row[0] * row[1]  # bytes a message x iterations, written and received here
        for key in ("sent_bytes", "rcvd_bytes"):
            grew = pod.after[rail][key] - pod.before[rail][key]
            assert grew >= moved, f"{rail} {key} grew by {grew} < {moved}"
    idle = pod.bystander.name
    assert pod.after[idle]["sent_bytes"] == pod.before[idle]["sent_bytes"]


async def test_each_shared_rail_routes_the_pods_peers_from_its_own_address(
    pod: PodRun,
) -> None:
    if pod.claims[0][1] == "":
        pytest.skip("whole-device rails move no netdev: no route of theirs (the shared run)")
    ifnames = dict(pod.claims)
    for n, rail in enumerate(pod.rails):
        ifname = ifnames[rail.name]
        got = sh("ip", "-j", "route", "get", PEER, "from", f"{SUBNET}.{10 + n}", netns=pod.netns)
        assert json.loads(got)[0]["dev"] == ifname, got


# ---------------------------------------------------------------- the 6.1 branch


@pytest.mark.on_61
@only_61
async def test_on_61_the_pods_whole_device_claims_are_refused_and_nothing_moves(
    client: Client,
) -> None:
    await set_netns_mode(client, "exclusive")  # before any netns: the kernel refuses after
    try:
        with rxe_devices(RAILS) as rails, temp_netns() as netns:
            for rail in rails:
                await known_to_rdmad(client, rail.name)
                opts = {"netdev": Variant("b", False), "pod_cdi_name": Variant("s", POD)}
                with pytest.raises(DBusCallError) as err:
                    await client.manager("Claim", "ssa{sv}", rail.name, netns, opts)
                assert err.value.name == "io.rdmad1.Error.NotSupported"
                assert "driver cannot change netns" in err.value.message
            assert rdma_dev_names(netns) == set()
            assert {r.name for r in rails} <= rdma_dev_names()
            assert await client.manager("ListClaims") == []
            devices = await listed(client)
            assert {devices[r.name][0] for r in rails} == {"available"}
    finally:
        await set_netns_mode(client, "shared")
