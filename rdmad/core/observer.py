"""What the core tells the rest of the daemon (the bus, the journal, CDI specs) after a change.

An observer subclasses CoreObserver and overrides the calls it cares about; the others do
nothing. The core calls them through Observers, which keeps an observer's bug from breaking
the state machine.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from rdmad.model import Claim, DeviceView, NetnsMode, ReleaseReason

log = logging.getLogger("rdmad.core.observer")


class CoreObserver:
    """Told after each change has been applied and persisted. Must not raise or block."""

    def device_added(self, view: DeviceView) -> None:
        """An RDMA device appeared in init_net."""

    def device_removed(self, view: DeviceView) -> None:
        """An RDMA device is gone (unplugged, driver unbound)."""

    def device_changed(self, view: DeviceView) -> None:
        """A device's view may differ from the last one told (its state, netdev, ports...)."""

    def claimed(self, claim: Claim) -> None:
        """A claim is made: the kernel part is done and the claim is on disk."""

    def claim_changed(self, claim: Claim) -> None:
        """A live claim's GIDs changed (an address in its netns came or went)."""

    def released(self, claim: Claim, reason: ReleaseReason) -> None:
        """A claim ended: what it took is back, and it is off disk."""

    def left_netns(self, claim: Claim, rest: list[Claim]) -> None:
        """A claim left a live netns without ending (a held claim detached, or its Attach
        undone): `rest`, the live claims still there. Told before claim_changed."""

    def mode_changed(self, mode: NetnsMode) -> None:
        """The RDMA subsystem's netns mode changed (or the subsystem turned up)."""


class Observers(CoreObserver):
    """Every observer, in the order added: each call goes to each of them. An observer that
    raises is logged and skipped, never the caller's problem."""

    def __init__(self) -> None:
        self._all: list[CoreObserver] = []

    def add(self, observer: CoreObserver) -> None:
        self._all.append(observer)

    def _each(self, call: Callable[[CoreObserver], None]) -> None:
        for observer in self._all:
            try:
                call(observer)
            except Exception:  # an observer bug must not break the state machine
                log.exception("observer %r failed", observer)

    def device_added(self, view: DeviceView) -> None:
        self._each(lambda o: o.device_added(view))

    def device_removed(self, view: DeviceView) -> None:
        self._each(lambda o: o.device_removed(view))

    def device_changed(self, view: DeviceView) -> None:
        self._each(lambda o: o.device_changed(view))

    def claimed(self, claim: Claim) -> None:
        self._each(lambda o: o.claimed(claim))

    def claim_changed(self, claim: Claim) -> None:
        self._each(lambda o: o.claim_changed(claim))

    def released(self, claim: Claim, reason: ReleaseReason) -> None:
        self._each(lambda o: o.released(claim, reason))

    def left_netns(self, claim: Claim, rest: list[Claim]) -> None:
        self._each(lambda o: o.left_netns(claim, rest))

    def mode_changed(self, mode: NetnsMode) -> None:
        self._each(lambda o: o.mode_changed(mode))
