"""Contract tests of a rolling upgrade, as the kubelet 1.33 and later lets a DaemonSet make
one (maxSurge 1): two instances of rdmad-dra on one node, the old pod's and the new one's,
each on sockets named after its pod UID (k8s.io/dynamic-resource-allocation's kubeletplugin
names), registered side by side; the kubelet calls either, and the plugin stays correct
whichever it calls: a claim is held once, its prepare answers the same from both, and an
instance stopped mid-prepare loses nothing. Real processes, a real rdmad (sim RDMA devices
on real veths, a private bus) and the loopback API server; no kubelet runs here."""

from __future__ import annotations

import asyncio
import shutil
import signal
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import grpc
import pytest

from testbed.dra import kubelet
from testbed.dra.apiserver import ApiServer
from testbed.dra.plugin_process import WAIT, Plugin, running_plugin
from tests.dra.contract import SERVICE, holds, prepare, serve
from tests.support.sim_rig import Rig

pytestmark = pytest.mark.usefixtures("root")  # real veths

A = kubelet.Claim("default", "0b9f2c1e-1111-4c3e-9a6e-000000000001", "pod-a-rdma")
OLD_POD = "5d0c3a4e-0000-4a1b-8c2d-00000000000a"
NEW_POD = "5d0c3a4e-0000-4a1b-8c2d-00000000000b"
WAITING = "waiting for"


@pytest.fixture
def node_dir() -> Iterator[Path]:
    """The node's kubelet directories, at a path short enough that the sockets keep the
    names with the whole pod UID in them (sun_path holds 108 bytes)."""
    path = Path(tempfile.mkdtemp(prefix="dra-", dir="/tmp"))
    yield path
    shutil.rmtree(path)


@pytest.fixture
async def old(api: ApiServer, rig: Rig, node_dir: Path) -> AsyncIterator[Plugin]:
    async with running_plugin(api, rig.daemon.bus_address, node_dir, pod_uid=OLD_POD) as p:
        yield p


@pytest.fixture
async def new(api: ApiServer, rig: Rig, node_dir: Path, old: Plugin) -> AsyncIterator[Plugin]:
    """Started while the old one serves, as maxSurge 1 starts it."""
    async with running_plugin(api, rig.daemon.bus_address, node_dir, pod_uid=NEW_POD) as p:
        yield p


def served(plugin: Plugin) -> list[Path]:
    return [plugin.registration_socket, plugin.endpoint]


async def test_two_instances_register_side_by_side_each_naming_its_own_endpoint(
    old: Plugin, new: Plugin
) -> None:
    found = kubelet.registration_sockets(str(old.registry_dir))
    infos = [await kubelet.get_info(reg) for reg in found]
    assert found == sorted(str(p.registration_socket) for p in (old, new))
    assert found[0].endswith(f"rdma.rdmad.io-{OLD_POD}-reg.sock")
    assert {i.name for i in infos} == {"rdma.rdmad.io"}
    assert [i.endpoint for i in infos] == [str(old.endpoint), str(new.endpoint)]
    assert old.endpoint.name == f"dra-{OLD_POD}.sock"
    assert all(kubelet.chosen_service(i) == SERVICE for i in infos)


async def test_a_claim_prepared_on_one_instance_answers_the_same_on_the_other_held_once(
    api: ApiServer, rig: Rig, old: Plugin, new: Plugin
) -> None:
    serve(api, A, ["sim0"])
    first = await prepare(old, A)
    again = await prepare(new, A)
    assert first[A.uid].error == "" and len(first[A.uid].devices) == 1
    assert again == first
    assert await holds(rig) == [("sim0", f"dra/{A.uid}/sim0", "held")]


async def test_a_claim_prepared_on_one_instance_is_unprepared_on_the_other(
    api: ApiServer, rig: Rig, old: Plugin, new: Plugin
) -> None:
    serve(api, A, ["sim0"])
    await prepare(old, A)
    assert await kubelet.unprepare(str(new.endpoint), SERVICE, [A]) == {A.uid: ""}
    assert await holds(rig) == []


async def test_sigterm_removes_the_instances_sockets_and_leaves_the_others_serving(
    old: Plugin, new: Plugin
) -> None:
    assert await old.stop() == 0
    assert [p.exists() for p in served(old)] == [False, False]
    assert not (old.endpoint.parent / f"grpc-{OLD_POD}").exists()
    assert kubelet.registration_sockets(str(new.registry_dir)) == [str(new.registration_socket)]
    assert (await kubelet.get_info(str(new.registration_socket))).endpoint == str(new.endpoint)


async def test_the_old_instance_stopped_mid_prepare_loses_nothing(
    api: ApiServer, rig: Rig, old: Plugin, new: Plugin
) -> None:
    serve(api, A, ["sim0"])
    api.stall_claims()
    channel = kubelet.connect(str(old.endpoint))
    on_old = kubelet.start_prepare(channel, SERVICE, [A])
    await api.wait_claim_reads(1)  # the old one is mid-prepare, holding the lock
    on_new = asyncio.create_task(kubelet.prepare_devices(str(new.endpoint), SERVICE, [A]))
    await new.wait_log(WAITING)  # the new one waits its turn
    old.proc.send_signal(signal.SIGTERM)  # the DaemonSet deletes the old pod
    await api.wait_claim_reads(2)  # the old one gave its turn up; the new one reads
    api.answer_claims()
    with pytest.raises(grpc.aio.AioRpcError):  # the kubelet's call to the old one fails
        await on_old
    got = await on_new
    await channel.close()
    assert await asyncio.wait_for(old.proc.wait(), WAIT) == 0  # stopped by the one SIGTERM
    assert got[A.uid].error == "" and len(got[A.uid].devices) == 1
    assert await holds(rig) == [("sim0", f"dra/{A.uid}/sim0", "held")]
    assert await prepare(new, A) == got
