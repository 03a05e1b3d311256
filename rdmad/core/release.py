"""How claims end, and who is told: a release the owner asks for, one the kernel forces
(netns death, device removal), a held claim's trip home (Detach, its sandbox's death), and
the Released notices, kept back while the daemon starts.

The core (rdmad.core.core.Core) decides which; GiveBack (rdmad.core.giveback) brings back
what the claim took; Records (rdmad.core.records) keeps the claim's record and its lock.
"""

from __future__ import annotations

import logging

from rdmad.core.giveback import GiveBack, log_not_returned, netns_alive
from rdmad.core.logfields import MESSAGE_NSID_REUSED, log_claim_event
from rdmad.core.parts import Part, Parts
from rdmad.core.records import back_to_held
from rdmad.core.steps import step
from rdmad.errors import RdmadError
from rdmad.model import Claim, ClaimPhase, ReleaseReason

log = logging.getLogger("rdmad.core.release")


class Release(Part):
    def __init__(self, parts: Parts, giveback: GiveBack) -> None:
        super().__init__(parts)
        self._giveback = giveback
        # Claims ended before the bus is up (start's reconcile, then events until the name
        # is taken), told to the observers by announce_startup: a Released sent earlier
        # would not come from io.rdmad1, and monitors match on that name.
        self._startup_releases: list[tuple[Claim, ReleaseReason]] | None = []

    # ------------------------------------------------------------------ the owner's
    async def release(self, claim: Claim) -> None:
        """A release the claim's owner asked for."""
        async with self._records.locked(claim):
            # By inode and cookie, not nsid: a dead netns's nsid may already name another one.
            # A NOT_RETURNED claim is on record as owed already.
            alive = claim.phase != ClaimPhase.HELD and await self._alive(claim)
            if claim.phase != ClaimPhase.NOT_RETURNED:
                claim.phase = ClaimPhase.RELEASING
                self._records.save(claim)
                step("releasing-written", f"claim {claim.id}")
            await self._giveback.give_back(claim, netns_alive=alive)
            self._records.end(claim, ReleaseReason.REQUESTED)
            self._records.save(claim)
            step("released-written", f"claim {claim.id}")
        self.finish(claim, ReleaseReason.REQUESTED)

    # ------------------------------------------------------------------ the kernel's
    async def end_claim(self, claim: Claim, reason: ReleaseReason) -> None:
        """End a claim the kernel ended for us (netns death, device removal)."""
        async with self._records.on_record(claim) as live:
            if not live:
                return  # released meanwhile
            if reason == ReleaseReason.NETNS_GONE and await self._alive(claim):
                # A stale RTM_DELNSID: nsids are reused as soon as a netns dies, so an event
                # still queued about a dead netns can carry the nsid this live one got since.
                nsid = claim.attached.nsid
                log_claim_event(
                    log,
                    MESSAGE_NSID_REUSED,
                    claim,
                    f"claim {claim.id}: nsid {nsid} was dropped but {claim.netns} is alive "
                    "(nsid reused); keeping the claim",
                    level=logging.INFO,
                )
                return
            if reason == ReleaseReason.NETNS_GONE and claim.hold is not None:
                # The pod's sandbox died, not the pod: its next sandbox attaches the claim.
                await self.hold_again(claim, netns_alive=False)
                return
            try:
                claim.phase = ClaimPhase.RELEASING
                # Unsaved (a full disk), nothing is given back: the next start finds the
                # claim as the file has it, its netns or device gone, and gives it back.
                self._records.save(claim)
                await self._giveback.give_back(
                    claim, netns_alive=reason != ReleaseReason.NETNS_GONE
                )
            except RdmadError as exc:
                log_not_returned(claim, exc, f"it ended ({reason.value}) all the same")
            self._records.end(claim, reason)
            self._records.save_end(claim)
        self.finish(claim, reason)

    # ------------------------------------------------------------------ held claims
    async def hold_again(self, claim: Claim, *, netns_alive: bool) -> None:
        """Give back what an attached held claim took and hold it for its pod again, with
        its char devices read in init_net (in exclusive mode the move home made uverbs
        anew). Under the device's lock. Unsaved, the record still says attached: the next
        start, or the netns's death, gives it back and holds it again."""
        hold = claim.hold
        assert hold is not None
        try:
            await self._giveback.give_back(claim, netns_alive=netns_alive)
        except RdmadError as exc:
            if netns_alive:  # a Detach: the claim stays where it is, for the caller to retry
                log_not_returned(claim, exc, f"it stays in {claim.netns}")
                raise
            log_not_returned(claim, exc, f"it is held for pod {hold.pod_uid} all the same")
        log.info("claim %s of %s is held for pod %s again", claim.id, claim.device, hold.pod_uid)
        rest = self.leave_netns(claim)
        dev = self._inv.devices.get(claim.device)
        if dev is not None:
            claim.chardevs = await self._rdma.chardevs(dev, hold.chardevs, None)
        try:
            self._records.save(claim)
        except RdmadError as exc:
            log.error("claim %s is held again, but that could not be saved: %s", claim.id, exc)
        if netns_alive:  # a dead netns's claims all leave it, each removing its own specs
            self._observers.left_netns(claim, rest)
        self._observers.claim_changed(claim)  # the bus's State and Netns, the CDI spec

    def leave_netns(self, claim: Claim) -> list[Claim]:
        """Hold an attached (or attaching) claim for its pod again, out of its netns: the
        live claims it leaves there, returned, are the pod its observers must rewrite."""
        rest = [c for c in self._records.pod_of(claim) if c is not claim]
        back_to_held(claim, self._book)
        return rest

    # ------------------------------------------------------------------ notices
    def finish(self, claim: Claim, reason: ReleaseReason) -> None:
        """A claim ended, its end saved: count it, tell it, announce its device."""
        self._stats.released(reason)
        self.tell_end(claim, reason)
        dev = self._inv.devices.get(claim.device)
        if dev is not None:
            self._tracker.announce(self._tracker.view(dev))

    def tell_end(self, claim: Claim, reason: ReleaseReason) -> None:
        """Tell the observers now, or (while starting) once announce_startup is called."""
        if self._startup_releases is not None:
            self._startup_releases.append((claim, reason))
        else:
            self._announce_end(claim, reason)

    def announce_startup(self) -> None:
        """Once every observer is attached and the bus name taken: tell them of the claims
        ended since start, and of every later one as it ends."""
        ended, self._startup_releases = self._startup_releases or [], None
        for claim, reason in ended:
            self._announce_end(claim, reason)

    def _announce_end(self, claim: Claim, reason: ReleaseReason) -> None:
        """Tell the observers (Released on the bus), then remove the claim's ENDED file."""
        self._observers.released(claim, reason)
        self._records.told_end(claim)

    async def _alive(self, claim: Claim) -> bool:
        return await netns_alive(self._resolver, claim)
