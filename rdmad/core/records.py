"""The claims on record and on disk: the book (rdmad.core.claims), the ended claims whose
Released is not sent yet, the state file (rdmad.core.store), and the lock a claim's
operation takes on its device."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator, Iterable
from typing import Protocol

from rdmad.core.claims import ClaimBook
from rdmad.core.store import State, Store
from rdmad.errors import NoSuchClaim, RdmadError
from rdmad.model import Claim, ClaimPhase, ReleaseReason

log = logging.getLogger("rdmad.core.records")


class ViewSync(Protocol):
    """What Records asks of the tracker (rdmad.core.tracking.InventoryTracker)."""

    def schedule_view_sync(self, devices: Iterable[str] | None = None) -> None: ...


class Records:
    def __init__(self, book: ClaimBook, store: Store, views: ViewSync) -> None:
        self.book = book
        self._store = store
        self._views = views
        # Ended claims whose Released is not sent yet: their ENDED files stay until it is.
        self.ending: dict[str, Claim] = {}

    def load(self) -> State:
        """The saved state, its live claims put in the book; the ENDED ones, whose end the
        last run saved but was killed before telling, are in `ending`."""
        state = self._store.load()
        live = [c for c in state.claims if c.phase != ClaimPhase.ENDED]
        self.book.load(live, state.pending_restores)
        self.ending.update((c.id, c) for c in state.claims if c.phase == ClaimPhase.ENDED)
        return state

    def pod_of(self, claim: Claim) -> list[Claim]:
        """The live claims of `claim`'s netns (its pod), it included while live: what every
        CDI spec of the pod describes (rdmad.daemon.cdi). O(claims in that netns). A claim
        held for a pod whose netns does not exist yet is a pod of its own."""
        if not claim.netns_inode:
            return [claim] if self.book.claims.get(claim.id) is claim else []
        return [c for c in self.book.in_netns_of(claim) if c.phase == ClaimPhase.ACTIVE]

    # ------------------------------------------------------------------ locking
    @contextlib.asynccontextmanager
    async def operating_on(self, device: str) -> AsyncIterator[None]:
        """Hold `device` for one claim or release; then announce whatever its view became."""
        try:
            async with self.book.lock(device):
                yield
        finally:
            self._views.schedule_view_sync({device})

    @contextlib.asynccontextmanager
    async def on_record(self, claim: Claim) -> AsyncIterator[bool]:
        """Lock the claim's device (operating_on), then tell whether the claim is still on
        record: one that ended while this waited for the lock is not to be touched."""
        async with self.operating_on(claim.device):
            yield self.book.claims.get(claim.id) is claim

    @contextlib.asynccontextmanager
    async def locked(self, claim: Claim) -> AsyncIterator[None]:
        """on_record for a caller: NoSuchClaim if the claim ended while this waited."""
        async with self.on_record(claim) as live:
            if not live:
                raise NoSuchClaim(f"claim {claim.id!r} ended while waiting")
            yield

    # ------------------------------------------------------------------ ending
    def end(self, claim: Claim, reason: ReleaseReason) -> None:
        """Out of the book, ENDED with `reason` until its observers are told (told_end): the
        caller saves it so, and a daemon killed in between tells them at its start."""
        self.book.drop(claim)
        claim.phase, claim.end_reason = ClaimPhase.ENDED, reason
        self.ending[claim.id] = claim

    def told_end(self, claim: Claim) -> None:
        """Its observers know it ended: remove its ENDED file."""
        if self.ending.pop(claim.id, None) is None:
            return
        try:
            self.save(claim)
        except RdmadError as exc:
            log.error("claim %s: its end is told, but its file stays: %s", claim.id, exc)

    # ------------------------------------------------------------------ saving
    def save(self, changed: Claim | None = None) -> None:
        """Save the state; `changed`: the one claim changed since the last save, if only
        one was (every change to a claim is followed by its save), else all of it."""
        book = self.book
        if changed is None:
            claims = [*book.claims.values(), *self.ending.values()]
            self._store.save(State(claims, list(book.pending_restores)))
        else:
            self._store.save_claim(
                changed,
                live=book.claims.get(changed.id) is changed or changed.id in self.ending,
                pending_restores=book.pending_restores,
            )

    def save_end(self, claim: Claim) -> None:
        """Save that a claim no caller is waiting on ended. Its kernel side is over, and its
        observers are to be told so, whatever the disk says: unsaved, the next start finds
        the claim's netns or device gone, or what it took home already, and ends it."""
        try:
            self.save(claim)
        except RdmadError as exc:
            log.error("claim %s ended, but its end could not be saved: %s", claim.id, exc)


def back_to_held(claim: Claim, book: ClaimBook) -> None:
    """A held claim whose Attach was undone: as Hold left it, waiting for its pod, and
    filed so in `book`."""
    claim.phase, claim.attachment = ClaimPhase.HELD, None
    book.refile(claim)
