"""Observer: one journal line per event, with the device, netns and claim as fields."""

from __future__ import annotations

import logging

from rdmad.core import logfields
from rdmad.core.observer import CoreObserver
from rdmad.model import Claim, DeviceView, NetnsMode, ReleaseReason

log = logging.getLogger(__name__)

_RELEASE_IDS = {
    ReleaseReason.REQUESTED: logfields.MESSAGE_RELEASED,
    ReleaseReason.NETNS_GONE: logfields.MESSAGE_NETNS_GONE,
    ReleaseReason.DEVICE_REMOVED: logfields.MESSAGE_RELEASED_DEVICE_REMOVED,
    ReleaseReason.RECONCILED: logfields.MESSAGE_RECONCILED,
}


class EventLog(CoreObserver):
    def device_added(self, view: DeviceView) -> None:
        dev = view.device
        logfields.log_event(
            log,
            logfields.MESSAGE_DEVICE_ADDED,
            f"RDMA device {dev.name} appeared (netdev {dev.netdev or 'none'}, {view.state})",
            device=dev.name,
        )

    def device_removed(self, view: DeviceView) -> None:
        logfields.log_event(
            log,
            logfields.MESSAGE_DEVICE_REMOVED,
            f"RDMA device {view.device.name} disappeared",
            device=view.device.name,
        )

    def device_changed(self, view: DeviceView) -> None:
        log.debug("device %s is %s in %s", view.device.name, view.state, view.netns)

    def claimed(self, claim: Claim) -> None:
        kind = "shared" if claim.shared else "whole-device"
        logfields.log_claim_event(
            log,
            logfields.MESSAGE_CLAIMED,
            claim,
            f"{claim.device} claimed ({kind}) into {claim.netns} as {claim.ifname or '-'}"
            f" by {claim.owner or 'unnamed owner'}",
        )

    def claim_changed(self, claim: Claim) -> None:
        gids = ", ".join(f"{g.index}={g.gid} ({g.type})" for g in claim.gids) or "none"
        logfields.log_claim_event(
            log,
            logfields.MESSAGE_GIDS_CHANGED,
            claim,
            f"{claim.device}: the GIDs of claim {claim.id} in {claim.netns} are now {gids}",
        )

    def released(self, claim: Claim, reason: ReleaseReason) -> None:
        logfields.log_claim_event(
            log,
            _RELEASE_IDS[reason],
            claim,
            f"{claim.device} released from {claim.netns} ({reason.value})",
            reason=reason.value,
        )

    def mode_changed(self, mode: NetnsMode) -> None:
        logfields.log_event(log, logfields.MESSAGE_MODE_CHANGED, f"RDMA netns mode is now {mode}")
