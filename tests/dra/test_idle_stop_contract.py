"""The kubelet's contract across the plugin's idle stop: its gRPC server runs only while the
kubelet calls and stops IDLE_S after the last call ends (rdmad/dra/rpc/on_demand.py), with a
GOAWAY on the connections it leaves. The kubelet keeps its channels (grpc-go dials again
for the next call, as the gRPC contract has it), and its plugin watcher dials the
registration socket at any time; the plugin answers either as before the stop."""

from __future__ import annotations

import pytest

from rdmad.dra.rpc.on_demand import IDLE_S
from testbed.dra import kubelet
from testbed.dra.apiserver import ApiServer
from testbed.dra.plugin_process import Plugin
from tests.dra.contract import SERVICE, holds, serve
from tests.support.sim_rig import Rig

pytestmark = pytest.mark.usefixtures("root")  # real veths

A = kubelet.Claim("default", "0b9f2c1e-1111-4c3e-9a6e-000000000001", "pod-a-rdma")
B = kubelet.Claim("default", "0b9f2c1e-2222-4c3e-9a6e-000000000002", "pod-b-rdma")
STOP_WAIT_S = IDLE_S + 30  # the stop's own time on a loaded host


async def stopped(plugin: Plugin, socket: object, nth: int = 1) -> None:
    """The `nth` idle stop of the gRPC server behind `socket`."""
    await plugin.wait_log(f"stopped the gRPC server for {socket} ", STOP_WAIT_S, nth)


async def no_stop_within(plugin: Plugin, seconds: float) -> None:
    with pytest.raises(AssertionError, match="never logged"):
        await plugin.wait_log(f"stopped the gRPC server for {plugin.endpoint} ", seconds)


async def test_a_kept_registration_channel_calls_again_after_the_idle_stop(
    plugin: Plugin,
) -> None:
    async with kubelet.connect(str(plugin.registration_socket)) as channel:
        first = await kubelet.get_info_on(channel)
        await stopped(plugin, plugin.registration_socket)
        assert await kubelet.get_info_on(channel) == first
        await kubelet.notify_registration_status_on(channel, True)
    await plugin.wait_log("the kubelet registered DRA driver")


async def test_the_watcher_dials_the_registration_socket_again_after_the_idle_stop(
    plugin: Plugin,
) -> None:
    registration = str(plugin.registration_socket)
    first = await kubelet.get_info(registration)
    await stopped(plugin, plugin.registration_socket)
    assert await kubelet.get_info(registration) == first
    await kubelet.notify_registration_status(registration, True)
    await stopped(plugin, plugin.registration_socket, nth=2)


async def test_a_kept_dra_channel_prepares_again_after_the_idle_stop(
    api: ApiServer, rig: Rig, plugin: Plugin
) -> None:
    serve(api, A, ["sim0"])
    serve(api, B, ["sim1"])
    async with kubelet.connect(str(plugin.endpoint)) as channel:
        assert (await kubelet.prepare_devices_on(channel, SERVICE, [A]))[A.uid].error == ""
        await stopped(plugin, plugin.endpoint)
        assert (await kubelet.prepare_devices_on(channel, SERVICE, [B]))[B.uid].error == ""
    assert sorted(await holds(rig)) == [
        ("sim0", f"dra/{A.uid}/sim0", "held"),
        ("sim1", f"dra/{B.uid}/sim1", "held"),
    ]


async def test_a_call_in_flight_past_the_idle_time_keeps_the_server_up(
    api: ApiServer, rig: Rig, plugin: Plugin
) -> None:
    serve(api, A, ["sim0"])
    api.stall_claims()
    async with kubelet.connect(str(plugin.endpoint)) as channel:
        call = kubelet.start_prepare(channel, SERVICE, [A])
        await api.wait_claim_reads(1)
        await no_stop_within(plugin, IDLE_S + 2)
        api.answer_claims()
        await call
    # Stopped IDLE_S after the call ended, not as it ended (a stop begun under it would).
    await no_stop_within(plugin, IDLE_S / 2)
    await stopped(plugin, plugin.endpoint)
    assert await holds(rig) == [("sim0", f"dra/{A.uid}/sim0", "held")]
