"""Issue 28 on the real kernel (7.3 guest): a ResourceClaim of an rxe device end to end
through containerd's CRI, as tests/cri/test_dra_pod.py runs it on the host with the sim
backend.

rdmad-dra's NodePrepareResources (the real plugin; the loopback API server serves the
claim, allocated a share slot of the device; the kubelet double calls it) holds a share of
the device for the pod (a whole rxe device is refused: moving its veth would destroy it).
RunPodSandbox runs rdmad-cni in pod mode as the pod's network, with static IPAM as through
Multus (the hold's interface is the sandbox's CNI_IFNAME, eth0), which attaches it: a
macvlan child of the device's netdev, with the address. CreateContainer with the prepare's
CDI device ID, and the host's rdma-core and perftest mounted read-only, then
StartContainer. In the container: ibv_devices, and an ib_write_bw pair on the device over
127.0.0.1 (soft-RoCE carries no traffic between netns, docs/kernel-notes.md), on the GID
index the CDI environment names. Then the pod is stopped and removed, the claim
unprepared, and the device is home.

The pod runs once for the module (fixture `run`, the costly part under TCG); each test
checks one thing of that run. The RDMA netns mode is the kernel's default, shared. 7.3
only, as the podman pod (test_podman_rails.py).

The same rdmad-dra (fixture `dra`: its start is most of a minute under TCG) then serves the
health test: setting an rxe device's netdev down takes the carrier and the rxe port (the
kernel's rxe follows its netdev); the kubelet double holds the health stream open and the
loopback API server holds the slices, as in the host's contract tests
(tests/dra/test_health_contract.py).
"""

from __future__ import annotations

import json
import logging
import re
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import pytest

from rdmad.dra.offer import device_name, slot_name
from rdmad.dra.slices import PORT_DOWN
from testbed.cri.containerd import IMAGE, private_containerd, require_containerd
from testbed.cri.image import write_image_archive
from testbed.cri.kubelet import Kubelet
from testbed.daemon import Client, RdmadProcess
from testbed.dra import kubelet as dra_kubelet
from testbed.dra.apiserver import ApiServer
from testbed.dra.claims import DRIVER, NODE, claim
from testbed.dra.plugin_process import Plugin, running_plugin
from tests.support.rdma import Rxe, known_to_rdmad, listed, sh, temp_rxe
from tests.support.traffic import WRITE_BW_ITERS, write_bw_row

pytestmark = [
    pytest.mark.guest,
    pytest.mark.usefixtures("in_guest", "daemon_log_on_failure"),
]

log = logging.getLogger(__name__)  # each step of the run, for a guest run that times out

SERVICE = "v1.DRAPlugin"
ADDRESS = "192.0.2.10/24"
SCRIPT_TIMEOUT_S = 300  # the ib_write_bw pair under TCG, on a loaded host
PLUGIN_START = 300.0  # s: rdmad-dra imports grpcio and the kubernetes client over 9p, TCG
CHANGE_S = 5.0  # health: the host's bound is 1 s (tests/dra); TCG runs Python slower
HOST_MOUNTS = ("/usr", "/lib", "/lib64", "/etc/libibverbs.d")  # rdma-core and perftest
# busybox sh in the container, the host's tools on PATH: its env, its devices, then an
# ib_write_bw pair on the device and GID index its CDI environment names; the client is
# started again until its server listens (the tool prints nothing when it does).
SCRIPT = """
export PATH=/usr/bin:/bin
echo "== env"; env
echo "== devices"; ibv_devices
bw="ib_write_bw -F -d $RDMAD_DEVICE -x $RDMAD_GID_INDEX -n ITERS"
$bw > /tmp/server 2>&1 &
until $bw 127.0.0.1 > /tmp/client 2>&1 || ! grep -q "Couldn't connect" /tmp/client; do :; done
wait
echo "== server"; cat /tmp/server; echo "== client"; cat /tmp/client
""".replace("ITERS", str(WRITE_BW_ITERS))


@dataclass(frozen=True)
class CriRun:
    """What the module's one pod run left to check."""

    device: str  # the rxe device the claim got
    netdev: str  # its netdev's host name
    held: list[Any]  # ListClaims after the prepare
    attached: list[Any]  # ListClaims once the sandbox ran
    eth0: str  # `ip -o addr show eth0` in the container
    out: str  # the container's script's output
    unprepared: dict[str, str]  # NodeUnprepareResources' errors by claim UID
    after: list[Any]  # ListClaims after the pod went and its claim was unprepared
    state_after: str  # the device's State then
    netdev_home: bool  # its netdev in init_net again, under its own name

    def section(self, name: str) -> str:
        """The script's output after "== NAME" up to the next "== " marker."""
        _, _, rest = self.out.partition(f"== {name}\n")
        return rest.split("\n== ", 1)[0]


def pod_network(rdmad: RdmadProcess) -> dict[str, Any]:
    ipam = {"type": "static", "addresses": [{"address": ADDRESS}]}
    return {"type": "rdmad", "pod": True, "busAddress": rdmad.bus_address, "ipam": ipam}


def host_mounts(kubelet: Kubelet) -> tuple[Any, ...]:
    pb = kubelet.cri.pb
    return tuple(pb.Mount(container_path=d, host_path=d, readonly=True) for d in HOST_MOUNTS)


async def device_state(client: Client, device: str) -> str:
    return (await listed(client))[device][0]


@pytest.fixture(scope="module")
async def dra(
    rdmad: RdmadProcess, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[tuple[ApiServer, Plugin]]:
    """rdmad-dra on the module's rdmad, the loopback API server its cluster; no slice it
    published was invalid."""
    api = ApiServer(NODE, DRIVER)
    with api.running():
        workdir = tmp_path_factory.mktemp("dra")
        async with running_plugin(api, rdmad.bus_address, workdir, PLUGIN_START) as plugin:
            yield api, plugin
    assert api.invalid == []


@pytest.fixture(scope="module")
async def run(
    client: Client,
    rdmad: RdmadProcess,
    dra: tuple[ApiServer, Plugin],
    tmp_path_factory: pytest.TempPathFactory,
) -> AsyncIterator[CriRun]:
    require_containerd()
    image = tmp_path_factory.mktemp("image") / "busybox.tar"
    write_image_archive(IMAGE, image)
    with temp_rxe("cr") as rxe:
        await known_to_rdmad(client, rxe.name)
        log.info("rdmad lists %s; starting containerd", rxe.name)
        api, plugin = dra
        async with private_containerd(rdmad.cdi_dir, "native") as containerd:
            containerd.add_network("rdmanet", [pod_network(rdmad)])
            kubelet = Kubelet(await containerd.start(image), containerd.pod_logs)
            log.info("containerd is up; preparing")
            # The kubelet's prepare, before the sandbox: the claim, reserved for the pod.
            pod_uid = str(uuid.uuid4())
            ref = dra_kubelet.Claim("team", str(uuid.uuid4()), "trainer-0-rdma")
            api.put_claim(
                claim(
                    ref.uid,
                    [slot_name(rxe.name, 0)],
                    name=ref.name,
                    namespace=ref.namespace,
                    pods=(pod_uid,),
                    parameters={"interfaceName": "eth0", "shared": True},
                )
            )
            prepared = await dra_kubelet.prepare_devices(str(plugin.endpoint), SERVICE, [ref])
            (result,) = prepared.values()
            assert result.error == "", result.error
            (device,) = result.devices
            held = list(await client.manager("ListClaims"))
            log.info("prepared: %s; RunPodSandbox", held)
            # The sandbox (its CNI ADD attaches the hold) and a container with the device.
            pod = await kubelet.run_pod("trainer-0", uid=pod_uid)
            attached = list(await client.manager("ListClaims"))
            log.info("the sandbox runs: %s; CreateContainer, StartContainer", attached)
            container = await kubelet.run_container(
                pod,
                "app",
                cdi_devices=tuple(device.cdi_device_ids),
                command=("/bin/sleep", "3600"),
                mounts=host_mounts(kubelet),
            )
            log.info("the container runs; ib_write_bw in it")
            eth0 = (await kubelet.exec(container, "/bin/ip", "-o", "addr", "show", "eth0")).stdout
            done = await kubelet.exec(
                container, "/bin/sh", "-c", SCRIPT, timeout_s=SCRIPT_TIMEOUT_S
            )
            log.info("the script is done; stop, remove, unprepare")
            # The pod ends: stopped and removed, then its claim unprepared.
            await kubelet.stop_pod(pod)
            await kubelet.remove_pod(pod)
            unprepared = await dra_kubelet.unprepare(str(plugin.endpoint), SERVICE, [ref])
            after = list(await client.manager("ListClaims"))
            yield CriRun(
                rxe.name,
                rxe.netdev,
                held,
                attached,
                eth0,
                done.stdout,
                unprepared,
                after,
                await device_state(client, rxe.name),
                rxe.netdev in sh("ip", "-o", "link", "show", rxe.netdev),
            )


async def test_the_prepare_holds_the_rxe_device_for_the_pod(run: CriRun) -> None:
    assert [(r[1], r[2]) for r in run.held] == [(run.device, "")]


async def test_the_sandboxs_cni_add_attaches_the_hold_as_the_pods_eth0(run: CriRun) -> None:
    assert [(r[1], r[3]) for r in run.attached] == [(run.device, "eth0")]
    assert run.attached[0][2].startswith("net:[")
    assert f"inet {ADDRESS}" in run.eth0


async def test_the_containers_environment_names_the_held_device(run: CriRun) -> None:
    env = dict(line.split("=", 1) for line in run.section("env").splitlines() if "=" in line)
    assert env["RDMAD_DEVICE"] == run.device, run.out
    assert env["NCCL_IB_HCA"] == f"={run.device}:1", run.out


async def test_ibv_devices_in_the_container_lists_the_held_device(run: CriRun) -> None:
    lines = run.section("devices").splitlines()[2:]  # past the two header lines
    assert run.device in {line.split()[0] for line in lines if line.strip()}, run.out


async def test_ib_write_bw_runs_in_the_container_on_the_held_device(run: CriRun) -> None:
    for end in ("server", "client"):
        out = run.section(end)
        row = write_bw_row(out)
        assert row is not None and row[1] == WRITE_BW_ITERS, run.out
        assert re.search(rf"Device\s*:\s*{run.device}\b", out), f"{end}:\n{out}"


async def test_stop_remove_and_unprepare_bring_the_device_home(run: CriRun) -> None:
    assert list(run.unprepared.values()) == [""]
    assert run.after == [], json.dumps(run.after)
    assert run.state_after == "available" and run.netdev_home


# ---------------------------------------------------------------- device health


def taints(devices: dict[str, dict[str, object]], name: str) -> object:
    return devices.get(name, {}).get("taints")


async def test_an_rxe_netdev_set_down_is_unhealthy_and_tainted_and_up_again_healthy(
    client: Client, dra: tuple[ApiServer, Plugin], rxe: Rxe
) -> None:
    api, plugin = dra
    await known_to_rdmad(client, rxe.name)
    name = device_name(rxe.name)
    async with dra_kubelet.watching_health(str(plugin.endpoint)) as health:
        report = await health.until(name, "HEALTHY", PLUGIN_START)
        assert report[name].message == f"port 1 is ACTIVE and {rxe.netdev} has carrier"
        sh("ip", "link", "set", rxe.netdev, "down")
        report = await health.until(name, "UNHEALTHY", CHANGE_S)
        assert report[name].message == f"port 1 is DOWN; {rxe.netdev} has no carrier"
        devices = await api.wait_for(lambda d: bool(taints(d, name)), CHANGE_S)
        assert [t["key"] for t in devices[name]["taints"]] == [PORT_DOWN]
        sh("ip", "link", "set", rxe.netdev, "up")
        await health.until(name, "HEALTHY", CHANGE_S)
        await api.wait_for(lambda d: name in d and not taints(d, name), CHANGE_S)
