"""Giving back what a claim took, wherever its netns is now: its RDMA limit lifted, its
netdev home to init_net with its host settings, its RDMA device back to init_net.

Every way a claim ends goes through here (rdmad.core.core.Core): a release, the kernel ending it
(netns death, device removal), the undo of a failed claim, and reconciliation at start. The
core decides when; this decides how, from what the claim recorded it moved.
"""

from __future__ import annotations

import contextlib
import logging

from rdmad.core.backend import NetnsResolver, Placement, RdmaBackend
from rdmad.core.logfields import MESSAGE_NOT_RETURNED, log_claim_event, log_event
from rdmad.core.parts import Part
from rdmad.core.steps import step
from rdmad.errors import RdmadError
from rdmad.model import Attachment, Claim, Counters, CounterScope, RdmaDevice

log = logging.getLogger(__name__)

# How long a physical netdev may take to come home after its netns died (measured: tens of ms).
RETURN_TIMEOUT_S = 5.0


def placement(claim: Claim) -> Placement:
    """Where a claim's netdev sits in its netns."""
    return Placement(claim.attached.nsid, claim.attached.ns_ifindex, claim.ifname)


class GiveBack(Part):
    async def give_back(self, claim: Claim, *, netns_alive: bool) -> None:
        """Return what a claim took, wherever it is now. Idempotent: parts already home are
        just restored. A held claim took nothing but its limit, if any."""
        self._limits.lift(claim)
        at = claim.attachment
        if at is not None:
            await self._give_back(claim, at, netns_alive)
        if not claim.shared:
            await self._tracker.reread_device(claim.device)

    async def _give_back(self, claim: Claim, at: Attachment, netns_alive: bool) -> None:
        if at.route_table and netns_alive:
            await self.unroute(claim)
        if at.netdev_moved:
            if claim.shared:
                if netns_alive:
                    with contextlib.suppress(RdmadError):  # already gone with its parent
                        await self._net.delete(placement(claim))
            elif netns_alive:
                await self.bring_netdev_home(claim)
            else:
                await self._restore_returned(claim)
            step("netdev-returned", f"claim {claim.id}")
        if at.rdma_moved and netns_alive and not await self._rdma_home(claim.device):
            source = self._resolver.reopen(at.netns_inode, at.netns_path)
            if source is not None:
                try:
                    await self._rdma.move_home(claim.device, source)
                finally:
                    source.close()
        elif at.rdma_moved:
            await self._await_rdma_return(claim)

    async def unroute(self, claim: Claim) -> None:
        """Remove the rules and routes of a claim's table from its netns (idempotent). A dead
        netns took them with it; the rail sysctls go with the netdev's leaving either way."""
        at = claim.attached
        target = self._resolver.reopen(at.netns_inode, at.netns_path)
        if target is None:
            return
        try:
            await self._net.remove_policy_routing(target, at.route_table)
        finally:
            target.close()
        step("routes-removed", f"claim {claim.id}")

    async def _await_rdma_return(self, claim: Claim) -> None:
        """The netns is dead: the kernel's rdma_dev_exit_net brings the device home by itself,
        shortly after RTM_DELNSID. Wait for it (the claim's lock keeps it in the inventory
        meanwhile), so the claim ends with the device available, not briefly "removed"."""
        if await self._rdma_home(claim.device):
            return
        if not await self._tracker.wait_for_device(claim.device, RETURN_TIMEOUT_S):
            log_claim_event(
                log,
                MESSAGE_NOT_RETURNED,
                claim,
                f"{claim.device} has not come back from {claim.netns} yet",
                level=logging.WARNING,
            )

    async def _rdma_home(self, device: str) -> bool:
        """Whether init_net sees `device` (a release killed after its move home finishes).
        Asked by its index (kept across netns moves), not by listing every device."""
        known = self._inv.devices.get(device)
        if known is None:
            return device in {d.name for d in await self._rdma.list_devices()}
        found = await self._rdma.get_device(known.index)
        return found is not None and found.name == device

    async def bring_netdev_home(self, claim: Claim) -> None:
        """From a live netns: delete a shared claim's child, move a whole claim's netdev home
        and restore its host settings."""
        at = claim.attached
        if claim.shared:
            await self._net.delete(placement(claim))
            return
        host = at.host
        assert host is not None
        home = self._inv.netdevs.get(host.ifindex)
        if home is not None:  # never left, or already back
            try:
                await self._net.restore(home.ifindex, host)
                await self._tracker.reread_netdev(home.ifindex)
                return
            except RdmadError as exc:
                # The inventory lags: the RTM_DELLINK of our own move may still be queued.
                log.debug("%s is not home after all (%s): bringing it home", host.name, exc)
        where = Placement(at.nsid, at.ns_ifindex or host.ifindex, claim.ifname)
        source = self._resolver.reopen(at.netns_inode, at.netns_path)
        try:
            self._tracker.netdev_is(await self._net.bring_home(where, host, source))
        finally:
            if source is not None:
                source.close()

    async def _restore_returned(self, claim: Claim) -> None:
        """The netns is dead: a physical netdev comes back by itself; wait, then restore it.
        A virtual one (a bond, a VLAN) died with the netns, unless a release moved it home
        before the netns died and was cut short before it restored it: then it is home,
        under its host name, down and without its addresses."""
        host = claim.attached.host
        if host is None:
            return
        if host.kind:
            home = self._inv.netdevs.get(host.ifindex)
            if home is None or (home.name, home.kind) != (host.name, host.kind):
                return
        elif host.ifindex not in self._inv.netdevs and not await self._tracker.wait_for_link(
            host.ifindex, RETURN_TIMEOUT_S
        ):
            log_claim_event(
                log,
                MESSAGE_NOT_RETURNED,
                claim,
                f"{host.name} (ifindex {host.ifindex}, the netdev of {claim.device}) has not "
                f"come back from {claim.netns} yet; will restore it when it does",
                level=logging.WARNING,
            )
            self._book.restore_later(host)
            return
        await self._net.restore(host.ifindex, host)
        await self._tracker.reread_netdev(host.ifindex)

    async def restore_pending(self) -> None:
        """Restore the host settings of the netdevs that came home late (pending_restores)."""
        for host in self._book.pending_restores:
            if host.ifindex in self._inv.netdevs:
                try:
                    await self._net.restore(host.ifindex, host)
                except RdmadError as exc:
                    # What is pending records the netdev only: no device, netns or claim.
                    log_event(
                        log,
                        MESSAGE_NOT_RETURNED,
                        f"could not restore the host settings of {host.name} "
                        f"(ifindex {host.ifindex}): {exc}",
                        level=logging.ERROR,
                    )
                self._book.restored(host)


def log_not_returned(claim: Claim, exc: BaseException, outcome: str) -> None:
    """The one record of a give-back that failed, wherever it failed: an ERROR with
    MESSAGE_NOT_RETURNED, the claim's fields and the error's D-Bus name. `outcome`: what
    becomes of the claim."""
    known = isinstance(exc, RdmadError)
    log_claim_event(
        log,
        MESSAGE_NOT_RETURNED,
        claim,
        f"could not give back what claim {claim.id} took of {claim.device}: "
        f"{exc if known else repr(exc)}; {outcome}",
        error=exc.dbus_name if isinstance(exc, RdmadError) else None,
        level=logging.ERROR,
    )


async def netns_alive(resolver: NetnsResolver, claim: Claim) -> bool:
    """Whether the claim's netns lives. The netns found by its inode may be a newer one:
    the kernel gives a dead netns's inode and nsid to the next ones made, so its cookie
    decides (a claim saved by an older rdmad has none: the inode has to do)."""
    at = claim.attachment
    target = resolver.reopen(at.netns_inode, at.netns_path) if at is not None else None
    if at is None or target is None:
        return False
    try:
        cookie = at.netns_cookie
        return not cookie or await resolver.cookie(target) == cookie
    finally:
        target.close()


async def read_counters(
    rdma: RdmaBackend,
    resolver: NetnsResolver,
    dev: RdmaDevice,
    holder: Claim | None,
    scope: CounterScope,
) -> Counters:
    """A device's counters. Where a whole-device claim (`holder`) took the device, read in
    the claim's netns, opened for this read only; in init_net while it is held."""
    at = holder.attachment if holder else None
    target = resolver.reopen(at.netns_inode, at.netns_path) if at else None
    try:
        return Counters(scope, await rdma.counters(dev, target))
    finally:
        if target is not None:
            target.close()
