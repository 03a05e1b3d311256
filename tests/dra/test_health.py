"""The device health rdmad-dra reports to the kubelet (rdmad/dra/health.py) and the taint it
publishes for a port that is down (rdmad/dra/slices.py), from rdmad's device properties."""

from __future__ import annotations

from typing import Any

import pytest

from rdmad.dra.health import Health, HealthReport, judged
from rdmad.dra.offer import RdmadState
from rdmad.dra.slices import PORT_DOWN, tainted
from tests.dra.test_offer import offer, props


def down(name: str = "mlx5_0", **more: Any) -> dict[str, Any]:
    return props(name, Ports=[(1, "DOWN", "DISABLED", "ens1f0")], Carrier=False, **more)


def state(*devices: dict[str, Any]) -> RdmadState:
    return RdmadState(list(devices), [], "shared", 2)


@pytest.mark.parametrize(
    ("device", "health", "message"),
    [
        (props(), Health.HEALTHY, "port 1 is ACTIVE and ens1f0 has carrier"),
        (props(Carrier=False), Health.UNHEALTHY, "ens1f0 has no carrier"),
        (
            props(Ports=[(1, "INIT", "LINK_UP", "ens1f0")]),
            Health.UNHEALTHY,
            "port 1 is INIT",
        ),
        (down(), Health.UNHEALTHY, "port 1 is DOWN; ens1f0 has no carrier"),
        (
            props(Ports=[], Carrier=False, NetDevice=""),
            Health.UNHEALTHY,
            "port 1 is missing; its netdev has no carrier",
        ),
        (
            props(state="claimed", Carrier=False),
            Health.UNKNOWN,
            "held whole by a claim: ens1f0 is in the pod's netns",
        ),
    ],
)
def test_a_device_is_judged_by_its_port_and_carrier(
    device: dict[str, Any], health: Health, message: str
) -> None:
    assert judged(device) == (health, message)


def test_a_report_names_every_device_and_slot_with_its_devices_health() -> None:
    report = HealthReport("node-a")
    report.update(state(props("mlx5_0"), down("mlx5_1")))
    assert {(d.device, d.health) for d in report.devices()} == {
        ("mlx5-0", Health.HEALTHY),
        ("mlx5-0--share-0", Health.HEALTHY),
        ("mlx5-0--share-1", Health.HEALTHY),
        ("mlx5-1", Health.UNHEALTHY),
        ("mlx5-1--share-0", Health.UNHEALTHY),
        ("mlx5-1--share-1", Health.UNHEALTHY),
    }


def test_a_device_rdmad_no_longer_lists_is_reported_gone() -> None:
    report = HealthReport("node-a")
    report.update(state(props("mlx5_0"), props("mlx5_1")))
    report.update(state(props("mlx5_1")))
    gone = {d.device: d for d in report.devices() if d.device.startswith("mlx5-0")}
    assert {(d.health, d.message) for d in gone.values()} == {
        (Health.UNHEALTHY, "the device is gone")
    }


def test_while_rdmad_cannot_be_read_every_device_is_unknown() -> None:
    report = HealthReport("node-a")
    report.update(state(props("mlx5_0")))
    report.update(None)
    assert {(d.health, d.message) for d in report.devices()} == {
        (Health.UNKNOWN, "rdmad cannot be read")
    }


async def test_a_stream_gets_the_whole_list_at_once_and_again_after_a_change() -> None:
    report = HealthReport("node-a")
    report.update(state(props("mlx5_0")))
    stream = report.reports()
    first = await anext(stream)
    assert {d.health for d in first} == {Health.HEALTHY}
    report.update(state(down("mlx5_0")))  # before the stream waits: not missed
    second = await anext(stream)
    assert {d.health for d in second} == {Health.UNHEALTHY}
    await stream.aclose()


@pytest.mark.parametrize("effect", ["NoSchedule", "NoExecute"])
def test_a_port_down_taints_the_device_and_its_slots_with_the_effect(effect: str) -> None:
    now = state(props("mlx5_0"), down("mlx5_1"))
    devices = tainted(offer(*now.devices, limit=2), now, effect)
    taints = {d["name"]: d.get("taints") for d in devices}
    expected = [{"key": PORT_DOWN, "value": "DOWN", "effect": effect}]
    assert taints == {
        "mlx5-0": None,
        "mlx5-0--share-0": None,
        "mlx5-0--share-1": None,
        "mlx5-1": expected,
        "mlx5-1--share-0": expected,
        "mlx5-1--share-1": expected,
    }


def test_effect_none_publishes_no_taint() -> None:
    now = state(down("mlx5_0"))
    devices = offer(*now.devices, limit=2)
    assert tainted(devices, now, "None") == devices
