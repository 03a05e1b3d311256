"""The health of the node's devices for the kubelet (KEP-4680), from rdmad's signals alone.

A device is healthy while its port 1 is ACTIVE and its netdev, in the host's netns, has
carrier; unhealthy when either is lost or rdmad no longer lists it, with a message that
says which. While a claim holds the device whole, its netdev is in the pod's netns, where
rdmad does not follow it: its health is unknown. Each share slot of a device has the
device's health. A report is the complete list the kubelet asks for: every device the
pool publishes or held, and every device rdmad listed since the plugin started and lists
no more, as gone.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import time
from collections.abc import AsyncGenerator, Callable, Mapping
from dataclasses import dataclass
from typing import Any

from rdmad.dra.offer import RdmadState, device_name, offered, rdma_device_of

# Declared with each device; the kubelet counts a device unknown once its last report is
# older. Reports are sent again after half of it, so a busy loop never lets one lapse, and
# an idle plugin wakes for that once in REFRESH_S.
TIMEOUT_S = 600
REFRESH_S = TIMEOUT_S / 2
ACTIVE = "ACTIVE"
CLAIMED_STATE = "claimed"  # rdmad's device state while a claim holds it whole


class Health(enum.IntEnum):
    """The kubelet's HealthStatus values (dra-health/v1)."""

    UNKNOWN = 0
    HEALTHY = 1
    UNHEALTHY = 2


@dataclass(frozen=True)
class DeviceHealth:
    device: str  # its name in the pool
    health: Health
    message: str


def port_state(props: Mapping[str, Any]) -> tuple[str, str]:
    """The device's first port and its state, from its D-Bus properties: ("port 1", "DOWN")."""
    ports = sorted(props["Ports"])
    return (f"port {ports[0][0]}", str(ports[0][1])) if ports else ("port 1", "missing")


def judged(props: Mapping[str, Any]) -> tuple[Health, str]:
    """The health of one rdmad device, from its D-Bus properties."""
    netdev = props["NetDevice"] or "its netdev"
    if props["State"] == CLAIMED_STATE:
        return Health.UNKNOWN, f"held whole by a claim: {netdev} is in the pod's netns"
    port, state = port_state(props)
    lost = []
    if state != ACTIVE:
        lost.append(f"{port} is {state}")
    if not props["Carrier"]:
        lost.append(f"{netdev} has no carrier")
    if lost:
        return Health.UNHEALTHY, "; ".join(lost)
    return Health.HEALTHY, f"{port} is {ACTIVE} and {netdev} has carrier"


def _report(state: RdmadState) -> dict[str, DeviceHealth]:
    by_rdma = {str(p["Name"]): p for p in state.devices}
    out = {}
    names = {device_name(rdma) for rdma in by_rdma} | {d["name"] for d in offered(state)}
    for name in sorted(names):
        rdma = rdma_device_of(name, by_rdma)
        if rdma is not None:
            out[name] = DeviceHealth(name, *judged(by_rdma[rdma]))
    return out


class HealthReport:
    """The pool's device health, kept current by `update` after each read of rdmad; each
    stream of `reports` gets the whole list at once and again on each change."""

    def __init__(self, pool: str, clock: Callable[[], float] = time.time) -> None:
        self.pool = pool
        self._clock = clock
        self._devices: dict[str, DeviceHealth] = {}
        self._changed = asyncio.Event()  # set at the next change, then replaced

    def devices(self) -> list[DeviceHealth]:
        return [self._devices[name] for name in sorted(self._devices)]

    def update(self, state: RdmadState | None) -> None:
        """Judge rdmad's devices again (`state` None: rdmad cannot be read)."""
        if state is None:
            why = "rdmad cannot be read"
            fresh = {n: DeviceHealth(n, Health.UNKNOWN, why) for n in self._devices}
        else:
            fresh = _report(state)
            for name in self._devices.keys() - fresh.keys():
                fresh[name] = DeviceHealth(name, Health.UNHEALTHY, "the device is gone")
        if fresh != self._devices:
            self._devices = fresh
            self._changed.set()
            self._changed = asyncio.Event()

    def now(self) -> int:
        """The Unix time each report gives as its devices' last determination."""
        return int(self._clock())

    async def reports(self) -> AsyncGenerator[list[DeviceHealth]]:
        """The whole list now, then after each change, or REFRESH_S after the last."""
        while True:
            changed = self._changed  # before the yield: a change meanwhile is not missed
            yield self.devices()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(changed.wait(), REFRESH_S)
