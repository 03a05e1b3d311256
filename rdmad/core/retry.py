"""The retry of claims not returned: a claim whose give-back the kernel refused at start
stays listed, NOT_RETURNED, and its give-back is tried again on the next kernel change to
its device, its netdev or its netns (and on Release, and at the next start)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable

from rdmad.core.events import (
    AddressChanged,
    Event,
    LinkChanged,
    LinkRemoved,
    RdmaChanged,
    Resync,
)
from rdmad.core.giveback import GiveBack, log_not_returned, netns_alive
from rdmad.core.parts import Part, Parts
from rdmad.core.release import Release
from rdmad.core.work import Job, Work
from rdmad.errors import RdmadError
from rdmad.model import Claim, ClaimPhase, ReleaseReason

log = logging.getLogger("rdmad.core.retry")

# Loop turns after a failed retry in which its own steps' events are read (and ignored).
ECHO_TURNS = 3
RETRIED = "it stays listed (not-returned), to be given back on the next change to its device "
RETRIED += "or netns, on Release, or at the next start"


class GiveBackRetry(Part):
    def __init__(self, parts: Parts, giveback: GiveBack, release: Release) -> None:
        super().__init__(parts)
        self._giveback = giveback
        self._release = release
        # NOT_RETURNED claims, by id (kept apart from the book so that an event costs
        # nothing while none is owed), and those whose give-back is being retried.
        self._owed: dict[str, Claim] = {}
        self._retrying: set[str] = set()
        self._work = Work(log)

    @staticmethod
    def keep(claim: Claim, exc: Exception) -> None:
        """The kernel refused a give-back at start: keep the claim listed, with the reason
        (owe then watches it)."""
        claim.phase = ClaimPhase.NOT_RETURNED
        claim.failure = str(exc) if isinstance(exc, RdmadError) else repr(exc)
        log_not_returned(claim, exc, RETRIED)

    def owe(self, claims: Iterable[Claim]) -> None:
        """From here on, a change to the device or netns of one of these retries it."""
        self._owed = {c.id: c for c in claims if c.phase == ClaimPhase.NOT_RETURNED}

    @property
    def busy(self) -> bool:
        return bool(self._retrying)

    async def quiesce(self) -> None:
        await self._work.quiesce()

    async def close(self) -> None:
        await self._work.close()

    def handle(self, event: Event) -> None:
        """A kernel event: retry the give-back of each claim owed that it concerns."""
        for claim in list(self._owed.values()):
            if self._records.book.claims.get(claim.id) is not claim:
                del self._owed[claim.id]  # released or ended since
            elif claim.id not in self._retrying and self._concerns(claim, event):
                self._retrying.add(claim.id)
                job = Job("giving back a not-returned claim", claim.device, claim.netns, claim.id)
                self._work.spawn(self._retry(claim), job)

    def _concerns(self, claim: Claim, event: Event) -> bool:
        """Whether `event` reports a change to the claim's RDMA device, its netdev (or a
        shared claim's parent) or its netns. A netns's death ends the claim: end_claim."""
        at = claim.attached
        dev = self._inv.devices.get(claim.device)
        netdevs = {at.host.ifindex} if at.host is not None else set()
        if dev is not None and dev.netdev_ifindex:
            netdevs.add(dev.netdev_ifindex)
        if isinstance(event, RdmaChanged):
            named = event.device or self._inv.device_of_chardev(event.chardev)
            return named in ("", claim.device)  # "": it could be any device
        if isinstance(event, LinkChanged):
            return event.netdev.ifindex in netdevs
        if isinstance(event, LinkRemoved):
            return event.ifindex in netdevs
        if isinstance(event, AddressChanged):
            return event.nsid == at.nsid if event.nsid is not None else event.ifindex in netdevs
        return isinstance(event, Resync)

    async def _retry(self, claim: Claim) -> None:
        """Try a NOT_RETURNED claim's give-back again; end the claim if it works."""
        try:
            if await self._given_back_again(claim):
                self._owed.pop(claim.id, None)
                self._release.finish(claim, ReleaseReason.RECONCILED)
                return
            # The events of this attempt's own steps are read in the next turns of the loop:
            # while the claim still counts as retrying, they retry nothing.
            for _ in range(ECHO_TURNS):
                await asyncio.sleep(0)
        finally:
            self._retrying.discard(claim.id)

    async def _given_back_again(self, claim: Claim) -> bool:
        """Whether the give-back worked this time (the claim is then ended and saved)."""
        async with self._records.on_record(claim) as live:
            if not live or claim.phase != ClaimPhase.NOT_RETURNED:
                return False  # released or ended meanwhile
            host = claim.attached.host
            if host is not None:  # the change may be its coming home: see it
                await self._tracker.reread_netdev(host.ifindex)
            alive = await netns_alive(self._resolver, claim)
            try:
                await self._giveback.give_back(claim, netns_alive=alive)
            except RdmadError as exc:
                log_not_returned(claim, exc, RETRIED)
                return False
            self._records.end(claim, ReleaseReason.RECONCILED)
            self._records.save_end(claim)
        return True
