"""rdmad-dra when nothing changes: no thread of it wakes, even while the kubelet holds the
health stream open, as it does for as long as it runs. Its own threads (the event loop, its
API worker, its claim reads' worker) sleep until something happens, and its gRPC server,
grpclib's, is the event loop's: it has no thread or timer of its own (docs/kubernetes.md,
"Performance")."""

from __future__ import annotations

import asyncio

import pytest

from testbed.dra import kubelet
from testbed.dra.apiserver import ApiServer
from testbed.dra.plugin_process import Plugin
from testbed.threads import GRPC_CORE_THREADS, polling, switches, woken
from tests.dra.contract import SERVICE, prepare, serve

pytestmark = pytest.mark.usefixtures("root")  # real veths

SETTLE_S = 1.0  # the last slice write's reply reaching the loop, after its log line
WINDOW_S = 3.0
A = kubelet.Claim("default", "0b9f2c1e-1111-4c3e-9a6e-000000000001", "pod-a-rdma")


@pytest.fixture
async def plugin(plugin: Plugin) -> Plugin:
    """conftest's plugin, once it has published its first slices."""
    await plugin.wait_log("rdmad.dra: published ")
    return plugin


async def stays_up(plugin: Plugin, seconds: float) -> None:
    """Wait `seconds` on the plugin's exit, which must not come."""
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(plugin.proc.wait(), seconds)


async def assert_nothing_wakes(plugin: Plugin) -> None:
    pid = plugin.proc.pid
    await stays_up(plugin, SETTLE_S)
    before = switches(pid)
    await stays_up(plugin, WINDOW_S)
    after = switches(pid)
    assert any(t.tid == pid for t in after), "the event loop's thread is measured"
    assert woken(before, after) == {}
    assert {t.name for t in after} & GRPC_CORE_THREADS == set()
    assert polling(pid) <= {pid}, "no thread but the event loop polls"


async def test_an_idle_plugin_that_the_kubelet_never_called_wakes_no_thread(
    plugin: Plugin,
) -> None:
    await assert_nothing_wakes(plugin)


async def test_an_idle_plugin_wakes_no_thread_while_the_kubelet_holds_the_health_stream(
    api: ApiServer, plugin: Plugin
) -> None:
    serve(api, A, ["sim0"])
    registration = str(plugin.registration_socket)
    await kubelet.get_info(registration)
    await kubelet.notify_registration_status(registration, True)
    assert (await prepare(plugin, A))[A.uid].error == ""
    assert await kubelet.unprepare(str(plugin.endpoint), SERVICE, [A]) == {A.uid: ""}
    async with kubelet.watching_health(str(plugin.endpoint)) as health:
        await health.next(WINDOW_S)
        await assert_nothing_wakes(plugin)
