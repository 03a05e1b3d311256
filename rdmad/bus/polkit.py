"""Asking polkit whether a caller may change state, as systemd's daemons do
(bus_verify_polkit_async): org.freedesktop.PolicyKit1.Authority.CheckAuthorization for the
caller's unique bus name, one action per kind of change (polkit/io.rdmad1.policy).

Root is never asked about. A node without polkitd is root only: that is said once, at
start; a call then gets AccessDenied. Every question has a bounded wait, so a stopped
polkitd refuses callers instead of hanging them.
"""

from __future__ import annotations

import asyncio
import enum
import logging

from dbus_fast import Message, MessageType, Variant
from dbus_fast.aio import MessageBus

from rdmad.bus.names import bus_daemon_call
from rdmad.errors import AccessDenied

log = logging.getLogger(__name__)

POLKIT_NAME = "org.freedesktop.PolicyKit1"
POLKIT_PATH = "/org/freedesktop/PolicyKit1/Authority"
POLKIT_IFACE = "org.freedesktop.PolicyKit1.Authority"
# CheckAuthorizationFlags: AllowUserInteraction (polkit asks the caller's agent for a password)
ALLOW_USER_INTERACTION = 1
# The longest wait for polkit's answer: the D-Bus default method timeout, which also
# leaves an interactive caller time to type a password.
AUTHORIZATION_TIMEOUT = 25.0


class Action(enum.StrEnum):
    """The polkit actions of polkit/io.rdmad1.policy."""

    CLAIM_DEVICE = "io.rdmad1.claim-device"
    CLAIM_SHARE = "io.rdmad1.claim-share"
    HOLD = "io.rdmad1.hold"
    RELEASE_OWN = "io.rdmad1.release-own"
    RELEASE_ANY = "io.rdmad1.release-any"
    SET_NETNS_MODE = "io.rdmad1.set-netns-mode"


class Polkit:
    """The polkit authority, reached over rdmad's own bus connection."""

    def __init__(self, bus: MessageBus, timeout: float = AUTHORIZATION_TIMEOUT) -> None:
        self._bus = bus
        self._timeout = timeout

    async def start(self) -> None:
        """Say once, at start, when polkitd is neither running nor activatable."""
        try:
            running = await self._ask_bus("NameHasOwner", "s", [POLKIT_NAME])
            activatable = await self._ask_bus("ListActivatableNames", "", [])
        except AccessDenied as exc:
            log.warning("cannot tell whether polkitd is on the bus (%s)", exc)
            return
        if not running.body[0] and POLKIT_NAME not in activatable.body[0]:
            log.warning("polkitd (%s) is not on the bus: only root may change state", POLKIT_NAME)

    async def check(
        self, sender: str, action: Action, details: dict[str, str], interactive: bool
    ) -> None:
        """Raise AccessDenied, naming `action`, unless polkit says `sender` may do it."""
        call = Message(
            destination=POLKIT_NAME,
            path=POLKIT_PATH,
            interface=POLKIT_IFACE,
            member="CheckAuthorization",
            signature="(sa{sv})sa{ss}us",
            body=[
                ["system-bus-name", {"name": Variant("s", sender)}],
                str(action),
                details,
                ALLOW_USER_INTERACTION if interactive else 0,
                "",
            ],
        )
        reply = await self._call(call, str(action))
        authorized, challenge, _ = reply.body[0]
        if authorized:
            return
        if challenge and not interactive:
            raise AccessDenied(
                f"{action}: not authorized by polkit (authentication is required: allow "
                "interactive authorization)"
            )
        raise AccessDenied(f"{action}: not authorized by polkit")

    async def _ask_bus(self, member: str, signature: str, body: list[object]) -> Message:
        return await self._call(bus_daemon_call(member, signature, body), member)

    async def _call(self, msg: Message, what: str) -> Message:
        """One bounded call; no reply in time, an error reply or a lost connection is
        AccessDenied (without polkit's word, only root may change state)."""
        try:
            async with asyncio.timeout(self._timeout):
                reply = await self._bus.call(msg)
        except TimeoutError:
            raise AccessDenied(
                f"{what}: polkit did not answer within {self._timeout:g} s: only root may "
                "change state without it"
            ) from None
        except (EOFError, OSError) as exc:
            raise AccessDenied(f"{what}: polkit could not be asked: {exc!r}") from exc
        if reply is None or reply.message_type is MessageType.ERROR:
            name = reply.error_name if reply is not None else "no reply"
            raise AccessDenied(
                f"{what}: polkit could not be asked ({name}): only root may change state without it"
            )
        return reply
