"""rdmad-dra when nothing changes: its own threads (the event loop, its API worker, grpc.aio's
completion-queue poller) sleep until something happens. gRPC's C-core threads do not: they
poll on timers compiled into grpcio (docs/kubernetes.md, "Performance"), so they are not
asserted on here; bench/dra.py reports them."""

from __future__ import annotations

import asyncio

import pytest

from tests.dra.plugin_process import Plugin
from tests.support.net import require_root
from tests.support.threads import GRPC_CORE_THREADS, switches, woken

pytestmark = pytest.mark.bus  # a private dbus-daemon

SETTLE_S = 1.0  # the last slice write's reply reaching the loop, after its log line
WINDOW_S = 3.0


@pytest.fixture(autouse=True)
def _root() -> None:
    require_root()


@pytest.fixture
async def plugin(plugin: Plugin) -> Plugin:
    """conftest's plugin, once it has published its first slices."""
    await plugin.wait_log("rdmad.dra: published ")
    return plugin


async def stays_up(plugin: Plugin, seconds: float) -> None:
    """Wait `seconds` on the plugin's exit, which must not come."""
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(plugin.proc.wait(), seconds)


async def test_an_idle_plugins_own_threads_do_not_wake(plugin: Plugin) -> None:
    await stays_up(plugin, SETTLE_S)
    before = switches(plugin.proc.pid)
    await stays_up(plugin, WINDOW_S)
    after = switches(plugin.proc.pid)
    ours = {t for t in after if t.name not in GRPC_CORE_THREADS}
    assert any(t.tid == plugin.proc.pid for t in ours), "the event loop's thread is measured"
    assert {t: n for t, n in woken(before, after).items() if t in ours} == {}
