"""rdmad-dra when the bus daemon goes away under it (dbus-daemon restarted): the plugin
exits 1, so that its supervisor starts it again on the new bus, and says why in one line,
with no traceback from the messages the lost connection still held."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest

from rdmad.dra.plugin import EXIT_FAILED
from testbed.bus import PrivateBus, start_private_bus
from testbed.dra.apiserver import ApiServer
from testbed.dra.plugin_process import WAIT, running_plugin
from tests.support.sim_rig import Rig

# A private dbus-daemon, this module's own: the test stops it. Real veths: root.
pytestmark = [pytest.mark.bus, pytest.mark.usefixtures("root")]

BUS_LOST = "rdmad.dra: stopped: the bus closed the connection ("


@pytest.fixture
def bus() -> Iterator[PrivateBus]:
    with start_private_bus() as b:
        yield b


@pytest.fixture
def bus_address(bus: PrivateBus) -> str:
    """The rig's rdmad on this module's own bus (not the session's, which the test would
    take from every test after it)."""
    return bus.address


async def test_losing_the_bus_stops_the_plugin_with_one_line_and_no_traceback(
    api: ApiServer, rig: Rig, bus: PrivateBus, tmp_path: Path
) -> None:
    async with running_plugin(api, bus.address, tmp_path / "dra") as plugin:
        await plugin.wait_log("rdmad.dra: published ")  # following rdmad over the bus
        bus.process.kill()
        bus.process.wait()
        status = await asyncio.wait_for(plugin.proc.wait(), WAIT)
    # running_plugin has read the plugin's stderr to its end: the log is whole.
    log = "\n".join(plugin.log)
    assert status == EXIT_FAILED, log
    stopped = [line for line in plugin.log if "stopped:" in line]
    assert len(stopped) == 1 and stopped[0].startswith(BUS_LOST), log
    assert "Traceback" not in log, log
    assert "never retrieved" not in log, log
