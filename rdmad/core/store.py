"""The state: claims and what they must restore, kept under /run/rdmad for the next start.

Claims are kernel state (a netdev sitting in a container's netns); the state is how a
restarted daemon finds out what it owes each device. It is saved before and after each
kernel step of a claim or release, so a save must cost the same on a node with 1 claim or
4000: each claim has its own file, and a save writes that one. What it costs is in
docs/performance.md ("In the node's size"), not here, where figures would go stale.
The layout, which `ls` shows (docs/reliability.md,
"The state directory"):

    daemon.json          the daemon-wide settings: netdevs to restore when they come home
    claims/<id>.json     one claim each
    claims/.spare        the last replaced content of a file (rdmad.core.swapfile); never read
    aside/<name>.<time>  files start could not read, kept for the operator

A claim's file is one flat object: its Attachment's fields (rdmad.model) sit beside the
claim's own, as zeros while the claim is held, so that files written before the attachment
was a type of its own read the same. Every file carries the schema version. A file that
cannot be read is set aside with a log line naming it and why, and only what it held is
lost. The layout before version 2 (one
state.json and its log, state.log) is converted at start.
"""

from __future__ import annotations

import json
import logging
import os
import time
from dataclasses import dataclass, field, fields, is_dataclass
from pathlib import Path
from typing import Any

from rdmad.core.swapfile import remove, write_new, write_swapped
from rdmad.errors import KernelError
from rdmad.model import (
    Attachment,
    CharDev,
    ChardevKind,
    Claim,
    ClaimPhase,
    Gid,
    HoldSpec,
    HostConfig,
    Port,
    RdmaDevice,
    RdmaLimit,
    ReleaseReason,
)

SCHEMA_VERSION = 2
DAEMON_FILE = "daemon.json"
CLAIMS_DIR = "claims"
SPARE = ".spare"
ASIDE_DIR = "aside"
# Schema 1: the whole state in one file, and a log of each claim's change since.
OLD_STATE_FILE = "state.json"
OLD_LOG_FILE = "state.log"
OLD_SPARE = "state.json.next"

log = logging.getLogger(__name__)


@dataclass
class State:
    claims: list[Claim] = field(default_factory=list)
    # Netdevs whose netns died before the kernel handed them back: restore on return.
    pending_restores: list[HostConfig] = field(default_factory=list)
    # Filled by Store.load: where the files it could not read were kept (each logged).
    set_aside: list[Path] = field(default_factory=list)


class CorruptState(Exception):
    """A state file exists but cannot be read: Store.load sets it aside. Never leaves the
    store, so it is not an RdmadError."""


# What reading a state file that is there can raise.
_UNREADABLE = (CorruptState, OSError, ValueError, KeyError, TypeError, AttributeError)


class Store:
    def __init__(self, directory: Path) -> None:
        self.path = directory / DAEMON_FILE
        self.claims_dir = directory / CLAIMS_DIR
        self.aside_dir = directory / ASIDE_DIR
        self._spare = self.claims_dir / SPARE
        self._encoded: dict[str, str] = {}  # claim id -> its JSON as in its file
        self._restores: list[HostConfig] | None = None  # as in daemon.json, if there

    def load(self) -> State:
        """What was saved; files that cannot be read are set aside (State.set_aside)."""
        set_aside = self._upgrade()
        claims: list[Claim] = []
        for path in sorted(self.claims_dir.glob("*.json")):
            try:
                claim = _claim_file(path.read_bytes())
                if claim.id != path.stem:
                    raise CorruptState(f"it holds claim {claim.id!r}")
            except _UNREADABLE as exc:
                set_aside.append(self._set_aside(path, exc, "the claim it held is forgotten"))
                continue
            claims.append(claim)
            self._encoded[claim.id] = claim_json(claim)
        restores: list[HostConfig] = []
        try:
            restores = _daemon_file(self.path.read_bytes())
            self._restores = list(restores)
        except FileNotFoundError:
            pass
        except _UNREADABLE as exc:
            lost = "the host settings of netdevs not yet home are forgotten"
            set_aside.append(self._set_aside(self.path, exc, lost))
        return State(claims, restores, set_aside)

    def save(self, state: State) -> None:
        """Make the saved state `state`: the files of the claims changed since their last
        save written, those of the claims gone removed. O(claims): for start."""
        self._save_restores(state.pending_restores)
        encoded = {c.id: claim_json(c) for c in state.claims}
        for claim_id in self._encoded.keys() - encoded.keys():
            self._remove_claim(claim_id)
        for claim_id, data in encoded.items():
            if self._encoded.get(claim_id) != data:
                self._write_claim(claim_id, data)

    def save_claim(self, claim: Claim, *, live: bool, pending_restores: list[HostConfig]) -> None:
        """Record one claim's change for the next start before returning: its new content, or
        (not `live`) that it ended; and `pending_restores` if changed since (only when a netns
        dies). They go first: a crash between the two files leaves the claim RELEASING,
        whose give-back the next start repeats, and never a netdev to restore forgotten."""
        self._save_restores(pending_restores)
        if live:
            self._write_claim(claim.id, claim_json(claim))
        else:
            self._remove_claim(claim.id)

    def _save_restores(self, pending_restores: list[HostConfig]) -> None:
        if pending_restores == self._restores:
            return
        data = _daemon_bytes(to_json(pending_restores))
        try:
            write_swapped(self.path, data, self._spare)
        except OSError as exc:
            raise KernelError(exc.errno or 0, f"cannot write state file {self.path}") from exc
        self._restores = list(pending_restores)

    def _write_claim(self, claim_id: str, encoded: str) -> None:
        path = self.claims_dir / f"{claim_id}.json"
        data = _claim_bytes(encoded)
        try:
            if claim_id in self._encoded:
                write_swapped(path, data, self._spare)
            else:
                write_new(path, data)
        except OSError as exc:
            raise KernelError(exc.errno or 0, f"cannot write state file {path}") from exc
        self._encoded[claim_id] = encoded

    def _remove_claim(self, claim_id: str) -> None:
        if claim_id not in self._encoded:
            return  # never written: its first write failed
        path = self.claims_dir / f"{claim_id}.json"
        try:
            # Frees the inode through RCU, but after the claim's last kernel step, when its
            # CDI spec is removed too (rdmad.daemon.cdi).
            remove(path)
        except OSError as exc:
            raise KernelError(exc.errno or 0, f"cannot remove state file {path}") from exc
        del self._encoded[claim_id]

    def _set_aside(self, path: Path, exc: BaseException, lost: str) -> Path:
        """Keep an unreadable file for the operator instead of overwriting the evidence."""
        stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
        aside = self.aside_dir / f"{path.name}.{stamp}"
        self.aside_dir.mkdir(parents=True, exist_ok=True)
        os.replace(path, aside)
        log.error("state file unreadable: %s (%s); kept as %s; %s", path, exc, aside, lost)
        return aside

    def _upgrade(self) -> list[Path]:
        """Convert schema 1's state.json and state.log into files of this layout, then
        remove them; a crash before the removal converts them again at the next start.
        Where they were set aside, if unreadable."""
        directory = self.path.parent
        old = [directory / name for name in (OLD_STATE_FILE, OLD_LOG_FILE)]
        if not any(p.exists() for p in old):
            return []
        try:
            state = _read_schema_1(*old)
        except _UNREADABLE as exc:
            lost = "the claims it held are forgotten"
            return [self._set_aside(p, exc, lost) for p in old if p.exists()]
        try:
            # Swapped, not written new: a crash may have left some of these files before.
            for claim in state.claims:
                data = _claim_bytes(claim_json(claim))
                write_swapped(self.claims_dir / f"{claim.id}.json", data, self._spare)
            restores = to_json(state.pending_restores)
            write_swapped(self.path, _daemon_bytes(restores), self._spare)
            for path in (*old, directory / OLD_SPARE):
                remove(path)
        except OSError as exc:
            raise KernelError(exc.errno or 0, f"cannot convert state file {old[0]}") from exc
        log.info("converted %s and %s to one file per claim", *old)
        return []


def _read_schema_1(snapshot: Path, changes: Path) -> State:
    """The state as schema 1 kept it: state.json with a generation, then state.log's lines
    of that generation, each a claim's new content or its end. Lines of another generation
    are from before the last whole write, which holds them; a torn last line was never
    saved."""
    claims: dict[str, Claim] = {}
    restores: list[HostConfig] = []
    generation = 0
    if snapshot.exists():
        doc = json.loads(snapshot.read_bytes())
        if doc.get("version") != 1:
            raise CorruptState(f"unknown schema version {doc.get('version')!r}")
        generation = int(doc.get("generation", 0))
        claims = {c.id: c for c in map(_claim_from, doc["claims"])}
        restores = [HostConfig(**_host_fields(h)) for h in doc["pending_restores"]]
    raw = changes.read_bytes() if changes.exists() else b""
    for line in raw[: raw.rfind(b"\n") + 1].splitlines():
        entry = json.loads(line)
        if entry["g"] != generation:
            continue
        if "claim" in entry:
            claim = _claim_from(entry["claim"])
            claims[claim.id] = claim
        else:
            claims.pop(entry["ended"], None)
    return State(list(claims.values()), restores)


# Compact: `jq . claims/*.json` reads them.
def _claim_bytes(encoded_claim: str) -> bytes:
    return f'{{"version":{SCHEMA_VERSION},"claim":{encoded_claim}}}'.encode()


def _daemon_bytes(encoded_restores: str) -> bytes:
    return f'{{"version":{SCHEMA_VERSION},"pending_restores":{encoded_restores}}}'.encode()


def _claim_file(raw: bytes) -> Claim:
    return _claim_from(_versioned(raw)["claim"])


def _daemon_file(raw: bytes) -> list[HostConfig]:
    return [HostConfig(**_host_fields(h)) for h in _versioned(raw)["pending_restores"]]


def _versioned(raw: bytes) -> Any:
    doc = json.loads(raw)
    if doc.get("version") != SCHEMA_VERSION:
        raise CorruptState(f"unknown schema version {doc.get('version')!r}")
    return doc


def to_json(value: Any) -> str:
    """`value` as compact JSON (`jq . claims/*.json` reads it), a dataclass as the object of
    its fields: the JSON of dataclasses.asdict, without its deep copies, and with json's
    encoder walking the values (the state is saved twice on each claim's and release's way:
    a walk in Python took a third of each save)."""
    return json.dumps(value, separators=(",", ":"), default=_fields_of)


def _fields_of(value: Any) -> dict[str, Any]:
    """A dataclass's fields by name, for json's encoder, which asks for what it cannot write."""
    cls = type(value)
    names = _FIELD_NAMES.get(cls)
    if names is None:
        if not is_dataclass(value):
            raise TypeError(f"{cls.__name__} cannot be written to a state file")
        names = _FIELD_NAMES[cls] = tuple(f.name for f in fields(value))
    return {name: getattr(value, name) for name in names}


_FIELD_NAMES: dict[type, tuple[str, ...]] = {}


# What a held claim's file says of its netns (no Attachment): as files have said it always.
_DETACHED = Attachment(netns_inode=0, netns_path="", nsid=-1)
_ATTACHMENT_FIELDS = tuple(f.name for f in fields(Attachment))


def claim_json(claim: Claim) -> str:
    """A claim as its file has it: one flat object, its attachment's fields among its own."""
    flat = _fields_of(claim)
    del flat["attachment"]
    flat.update(_fields_of(claim.attachment or _DETACHED))
    return to_json(flat)


def _host_fields(raw: dict[str, Any]) -> dict[str, Any]:
    raw = dict(raw)
    raw["addresses"] = tuple(raw["addresses"])
    return raw


def _claim_from(raw: dict[str, Any]) -> Claim:
    raw = dict(raw)
    if raw.get("host") is not None:
        raw["host"] = HostConfig(**_host_fields(raw["host"]))
    raw["chardevs"] = tuple(
        CharDev(ChardevKind(c["kind"]), c["path"], c["major"], c["minor"]) for c in raw["chardevs"]
    )
    raw["gids"] = tuple(Gid(**g) for g in raw.get("gids", ()))  # absent before GIDs were kept
    raw["ns_addresses"] = tuple(raw.get("ns_addresses", ()))  # absent before they were kept
    raw.pop("chardev_kinds", None)  # kept by earlier versions, never needed
    raw["phase"] = ClaimPhase(raw["phase"])
    if raw.get("end_reason") is not None:  # absent before ENDED was saved
        raw["end_reason"] = ReleaseReason(raw["end_reason"])
    hold = raw.get("hold")  # absent before Hold existed
    if hold is not None:
        hold["chardevs"] = tuple(ChardevKind(k) for k in hold["chardevs"])
        raw["hold"] = HoldSpec(**hold)
    moved = raw.get("moved_device")  # absent before it was kept
    if moved is not None:
        moved["ports"] = tuple(Port(**p) for p in moved["ports"])
        moved["chardevs"] = tuple(moved["chardevs"])
        raw["moved_device"] = RdmaDevice(**moved)
    if raw.get("limit") is not None:  # absent before limits existed
        raw["limit"] = RdmaLimit(**raw["limit"])
    # Absent (netns_cookie, route_table, moved_device, gids) in files of older versions.
    at = {name: raw.pop(name) for name in _ATTACHMENT_FIELDS if name in raw}
    held = not at.get("netns_inode")  # a held claim's file says netns_inode 0
    return Claim(**raw, attachment=None if held else Attachment(**at))
