"""Contract tests of device health (KEP-4680) and port-down taints (KEP-5055) with a real
rdmad: sim RDMA devices on real veths, whose port is ACTIVE while the veth is up with
carrier. The kubelet double holds the health stream open as the kubelet does
(testbed/dra/kubelet.py, on grpcio: a gRPC apart from the plugin's); setting a veth's peer
down takes its carrier, and with it the port. The loopback API server validates every slice
(the `api` fixture) and stamps taints as the real one does."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from kubernetes.client import V1ResourceSlice

from rdmad.dra.health import TIMEOUT_S
from rdmad.dra.offer import is_slot
from rdmad.dra.slices import PORT_DOWN
from testbed.dra import kubelet
from testbed.dra.apiserver import ApiServer
from testbed.dra.plugin_process import Plugin, running_plugin
from testbed.net import VethPair, ip
from tests.support.sim_rig import Rig, running_rig

pytestmark = pytest.mark.usefixtures("root")  # real veths

CHANGE_S = 1.0  # a port's change to the stream and to the slice


def set_up(pair: VethPair, up: bool) -> None:
    """Both ends up, or the peer down: the host end, the sim device's netdev, loses carrier."""
    for end in (pair.peer, pair.host) if up else (pair.peer,):
        ip("link", "set", end, "up" if up else "down")


@pytest.fixture
async def rig(bus_address: str, tmp_path: Path) -> AsyncIterator[Rig]:
    """conftest's rig, its veths up with carrier: both ports ACTIVE."""
    async with running_rig(bus_address, tmp_path) as r:
        for pair in r.nics.values():
            set_up(pair, True)
        yield r


@pytest.fixture
async def health(plugin: Plugin, api: ApiServer) -> AsyncIterator[kubelet.HealthStream]:
    """The v1 stream, once the plugin has published both devices."""
    await api.wait_for(lambda d: {"sim0", "sim1"} <= set(d))
    async with kubelet.watching_health(str(plugin.endpoint)) as stream:
        yield stream


@pytest.mark.parametrize("service", kubelet.HEALTH_SERVICES)
async def test_the_stream_opens_with_every_device_healthy_and_the_timeout_it_keeps(
    plugin: Plugin, api: ApiServer, rig: Rig, service: str
) -> None:
    published = await api.wait_for(lambda d: {"sim0", "sim1"} <= set(d))
    async with kubelet.watching_health(str(plugin.endpoint), service) as stream:
        report = await stream.next(CHANGE_S)
    assert set(report) == set(published), "every published device, slots too"
    for name, device in report.items():
        assert (device.pool, device.health) == (api.node, "HEALTHY"), name
        assert device.timeout == TIMEOUT_S
        assert abs(device.last_updated - time.time()) < 5
    nic = rig.nic("sim0")
    assert report["sim0"].message == f"port 1 is ACTIVE and {nic} has carrier"


async def test_a_lost_carrier_is_on_the_stream_within_1s_and_its_return_too(
    rig: Rig, health: kubelet.HealthStream
) -> None:
    await health.until("sim0", "HEALTHY", CHANGE_S)
    set_up(rig.nics["sim0"], False)
    report = await health.until("sim0", "UNHEALTHY", CHANGE_S)
    nic = rig.nic("sim0")
    assert report["sim0"].message == f"port 1 is DOWN; {nic} has no carrier"
    assert report["sim1"].health == "HEALTHY", "the other device is untouched"
    slots = [name for name in report if is_slot(name) and name.startswith("sim0")]
    assert slots and {report[s].health for s in slots} == {"UNHEALTHY"}
    set_up(rig.nics["sim0"], True)
    await health.until("sim0", "HEALTHY", CHANGE_S)


async def test_a_port_down_taints_the_device_and_its_slots_and_up_untaints_them(
    api: ApiServer, rig: Rig, plugin: Plugin
) -> None:
    await api.wait_for(lambda d: {"sim0", "sim1"} <= set(d))
    set_up(rig.nics["sim0"], False)
    devices = await api.wait_for(lambda d: bool(d.get("sim0", {}).get("taints")), timeout=CHANGE_S)
    for slice_ in api.slices.values():
        V1ResourceSlice.model_validate(slice_)  # the client's model of each taint too
    (taint,) = devices["sim0"]["taints"]
    assert {k: taint[k] for k in ("key", "value", "effect")} == {
        "key": PORT_DOWN,
        "value": "DOWN",
        "effect": "NoSchedule",
    }
    assert all(d.get("taints") for n, d in devices.items() if n.startswith("sim0"))
    assert not devices["sim1"].get("taints")
    set_up(rig.nics["sim0"], True)
    await api.wait_for(
        lambda d: "sim0" in d and not any(x.get("taints") for x in d.values()), timeout=CHANGE_S
    )


@pytest.mark.parametrize(("flag", "effect"), [("NoExecute", "NoExecute"), ("None", None)])
async def test_the_taints_effect_is_the_flags_and_none_publishes_no_taint(
    api: ApiServer, rig: Rig, tmp_path: Path, flag: str, effect: str | None
) -> None:
    set_up(rig.nics["sim0"], False)
    extra = ["--port-down-taint", flag]
    async with (
        running_plugin(api, rig.daemon.bus_address, tmp_path / "dra", extra=extra) as plugin,
        kubelet.watching_health(str(plugin.endpoint)) as health,
    ):
        await health.until("sim0", "UNHEALTHY", CHANGE_S)  # the plugin has seen it down
        devices = await api.wait_for(
            lambda d: "sim0" in d and (not effect or "taints" in d["sim0"])
        )
    assert [t["effect"] for t in devices["sim0"].get("taints") or []] == (
        [effect] if effect else []
    )
