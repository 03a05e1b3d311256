"""The state file: claims and what they must restore, written atomically under /run/rdmad.

Claims are kernel state (a netdev sitting in a container's netns); the file is how a
restarted daemon finds out what it owes each device.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass, field, fields, is_dataclass
from pathlib import Path
from typing import Any

from rdmad.errors import KernelError
from rdmad.model import CharDev, ChardevKind, Claim, ClaimPhase, Gid, HostConfig
from rdmad.swapfile import write_swapped

SCHEMA_VERSION = 1
STATE_FILE = "state.json"

log = logging.getLogger("rdmad.store")


@dataclass
class State:
    claims: list[Claim] = field(default_factory=list)
    # Netdevs whose netns died before the kernel handed them back: restore on return.
    pending_restores: list[HostConfig] = field(default_factory=list)


class CorruptState(Exception):
    """The state file exists but cannot be read; the daemon rebuilds from the kernel.

    Raised by Store.load, which runs at start only (Core.start handles it): it never
    reaches a D-Bus caller, so it is not an RdmadError."""


class Store:
    def __init__(self, directory: Path) -> None:
        self.path = directory / STATE_FILE
        self._encoded: dict[str, str] = {}  # claim id -> its JSON as of its last change

    def load(self) -> State:
        """Empty state if there is no file; CorruptState if it is torn or unreadable."""
        try:
            raw = self.path.read_bytes()
        except FileNotFoundError:
            return State()
        try:
            doc = json.loads(raw)
            if doc.get("version") != SCHEMA_VERSION:
                raise CorruptState(f"unknown schema version {doc.get('version')!r}")
            return State(
                claims=[_claim_from(c) for c in doc["claims"]],
                pending_restores=[HostConfig(**_host_fields(h)) for h in doc["pending_restores"]],
            )
        except CorruptState:
            raise
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise CorruptState(f"{self.path}: {exc}") from exc

    def save(self, state: State, changed: Claim | None = None) -> None:
        """Atomic and durable: a crash leaves the old or the new file (rdmad.swapfile).

        `changed` is the one claim that changed since the last save (None: any may have):
        the others' JSON is reused, so a save encodes one claim, not every claim."""
        if changed is None:
            self._encoded = {}
        else:
            self._encoded.pop(changed.id, None)
        encoded = {c.id: self._encoded.get(c.id) or _compact(plain(c)) for c in state.claims}
        self._encoded = encoded
        restores = _compact([plain(h) for h in state.pending_restores])
        # Compact: each claim saves twice on its way, and indenting doubled the encoding's
        # cost. `jq . state.json` reads it.
        data = (
            f'{{"version":{SCHEMA_VERSION},"claims":[{",".join(encoded.values())}],'
            f'"pending_restores":{restores}}}'
        ).encode()
        try:
            # Swapped in, not renamed over: replacing the file would free an inode through
            # RCU just before the netns move that follows, and the move would wait for it.
            write_swapped(self.path, data)
        except OSError as exc:
            raise KernelError(exc.errno or 0, f"cannot write state file {self.path}") from exc

    def move_aside(self) -> Path:
        """Keep a corrupt file for the operator instead of overwriting the evidence."""
        aside = self.path.with_name(self.path.name + ".corrupt")
        os.replace(self.path, aside)
        return aside


def _compact(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"))


def plain(value: Any) -> Any:
    """dataclasses.asdict without its deep copies: the same JSON in a third of the time
    (the state is saved twice on each claim's and release's way)."""
    names = _field_names(type(value))
    if names is not None:
        return {name: plain(getattr(value, name)) for name in names}
    if isinstance(value, tuple | list):
        return [plain(v) for v in value]
    return value


_FIELD_NAMES: dict[type, tuple[str, ...] | None] = {}


def _field_names(cls: type) -> tuple[str, ...] | None:
    if cls not in _FIELD_NAMES:
        _FIELD_NAMES[cls] = tuple(f.name for f in fields(cls)) if is_dataclass(cls) else None
    return _FIELD_NAMES[cls]


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
    raw.pop("chardev_kinds", None)  # kept by earlier versions, never needed
    raw["phase"] = ClaimPhase(raw["phase"])
    return Claim(**raw)
