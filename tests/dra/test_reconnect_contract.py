"""Contract tests of a kubelet that connects, drops its channel and reconnects (it restarts,
or its connection breaks), as the kubelet does it (testbed/dra/kubelet.py): the plugin process
stays up, registers again on the new channel, and a prepare of the same claim answers the
same with one hold in rdmad, whether the dropped channel took a prepare's answer with it or
not. A real rdmad (sim RDMA devices on real veths, a private bus) and the loopback API
server."""

from __future__ import annotations

import asyncio

import pytest

from testbed.dra import kubelet
from testbed.dra.apiserver import ApiServer
from testbed.dra.plugin_process import Plugin
from tests.dra.contract import SERVICE, holds, serve
from tests.support.sim_rig import Rig

pytestmark = pytest.mark.usefixtures("root")  # real veths

A = kubelet.Claim("default", "0b9f2c1e-1111-4c3e-9a6e-000000000001", "pod-a-rdma")
REGISTERED = "the kubelet registered DRA driver rdma.rdmad.io"


async def register(plugin: Plugin, times: int) -> kubelet.PluginInfo:
    """The plugin watcher's GetInfo and NotifyRegistrationStatus on a new channel, which it
    then drops; the plugin has logged `times` registrations."""
    async with kubelet.connect(str(plugin.registration_socket)) as channel:
        info = await kubelet.get_info_on(channel)
        assert kubelet.chosen_service(info) == SERVICE
        await kubelet.notify_registration_status_on(channel, True)
    await plugin.wait_log(REGISTERED, nth=times)
    return info


async def test_a_kubelet_that_reconnects_gets_the_same_info_and_registers_the_plugin_again(
    api: ApiServer, rig: Rig, plugin: Plugin
) -> None:
    first = await register(plugin, times=1)
    again = await register(plugin, times=2)
    assert again == first
    assert plugin.proc.returncode is None


async def test_a_prepare_again_on_a_new_channel_answers_the_same_with_one_hold(
    api: ApiServer, rig: Rig, plugin: Plugin
) -> None:
    serve(api, A, ["sim0"])
    info = await register(plugin, times=1)
    async with kubelet.connect(info.endpoint) as channel:
        first = await kubelet.prepare_devices_on(channel, SERVICE, [A])
    await register(plugin, times=2)
    async with kubelet.connect(info.endpoint) as channel:
        again = await kubelet.prepare_devices_on(channel, SERVICE, [A])
    assert first[A.uid].error == "" and len(first[A.uid].devices) == 1
    assert again == first
    assert await holds(rig) == [("sim0", f"dra/{A.uid}/sim0", "held")]
    assert plugin.proc.returncode is None


async def test_a_prepare_dropped_mid_call_is_abandoned_and_the_next_one_holds_once(
    api: ApiServer, rig: Rig, plugin: Plugin
) -> None:
    serve(api, A, ["sim0"])
    info = await register(plugin, times=1)
    api.stall_claims()
    channel = kubelet.connect(info.endpoint)
    dropped = kubelet.start_prepare(channel, SERVICE, [A])
    await api.wait_claim_reads(1)  # the plugin is in the call, waiting on the API server
    await channel.close()
    with pytest.raises(asyncio.CancelledError):  # the kubelet's side: no answer, ever
        await dropped
    assert plugin.proc.returncode is None

    await register(plugin, times=2)
    async with kubelet.connect(info.endpoint) as channel:
        call = asyncio.create_task(kubelet.prepare_devices_on(channel, SERVICE, [A]))
        # The new call reads the claim only once the dropped one let go of it (one call a
        # claim at a time): the plugin gave the dropped call up.
        await api.wait_claim_reads(2)
        api.answer_claims()
        got = await call
    assert got[A.uid].error == "" and len(got[A.uid].devices) == 1
    assert await holds(rig) == [("sim0", f"dra/{A.uid}/sim0", "held")]
    assert plugin.proc.returncode is None
