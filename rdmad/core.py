"""The state machine: inventory, claims, release, reconciliation, kernel events.

Imports no D-Bus, pyroute2 or pyudev. It drives the protocols in rdmad.backend, is fed
the events in rdmad.events, persists through a Store and tells observers what changed.
"""

from __future__ import annotations

from typing import Protocol

from rdmad.backend import NetnsTarget
from rdmad.events import Event
from rdmad.model import Claim, ClaimOptions, DeviceView, NetnsMode, ReleaseReason


class CoreObserver(Protocol):
    """Told after each change has been applied and persisted. Must not raise or block."""

    def device_added(self, view: DeviceView) -> None: ...

    def device_removed(self, view: DeviceView) -> None: ...

    def device_changed(self, view: DeviceView) -> None: ...

    def claimed(self, claim: Claim) -> None: ...

    def released(self, claim: Claim, reason: ReleaseReason) -> None: ...

    def mode_changed(self, mode: NetnsMode) -> None: ...


class Core:
    """API used by the bus edge (sketch; implemented below in the same module)."""

    netns_mode: NetnsMode

    def add_observer(self, observer: CoreObserver) -> None: ...

    def devices(self) -> list[DeviceView]: ...

    def device(self, name: str) -> DeviceView:
        """Raises NoSuchDevice."""
        ...

    def claims(self) -> list[Claim]: ...

    def get_claim(self, claim_id: str) -> Claim:
        """Raises NoSuchClaim."""
        ...

    async def claim(self, device: str, target: NetnsTarget, options: ClaimOptions) -> Claim:
        """Claim `device` for `target`. The core closes `target` before returning."""
        ...

    async def release(
        self, claim_id: str, reason: ReleaseReason = ReleaseReason.REQUESTED
    ) -> None: ...

    async def set_netns_mode(self, mode: NetnsMode) -> None: ...

    def handle(self, event: Event) -> None:
        """Queue a kernel event; processed in order on the loop."""
        ...
