"""Who is calling: the sender of the method call being handled, and its uid and groups.

dbus-fast method handlers get only the arguments. The bus runs user message handlers
(BaseMessageBus.add_message_handler) synchronously just before it dispatches a call, and
a coroutine method runs in a Task whose context is copied when the Task is created, so a
ContextVar set in that handler is what the method sees as "the message I am handling".
"""

from __future__ import annotations

from contextvars import ContextVar

from dbus_fast import Message, MessageType
from dbus_fast.aio import MessageBus

from rdmad.bus.names import DBUS_NAME, DBUS_PATH
from rdmad.errors import AccessDenied, RdmadError

_current: ContextVar[Message | None] = ContextVar("rdmad_current_message", default=None)

_NAME_OWNER_CHANGED = (
    f"type='signal',sender='{DBUS_NAME}',interface='{DBUS_NAME}',"
    f"member='NameOwnerChanged',path='{DBUS_PATH}'"
)


def current_message() -> Message | None:
    """The method call being handled in this task, None outside a handler."""
    return _current.get()


class Credentials:
    """Looks up (and caches per unique name) the unix uid and groups of bus peers."""

    def __init__(self, bus: MessageBus, allowed_gid: int | None) -> None:
        self._bus = bus
        self.allowed_gid = allowed_gid
        self._uids: dict[str, int] = {}
        self._groups: dict[str, frozenset[int]] = {}

    async def start(self) -> None:
        """Hook into dispatch and watch for peers leaving. Call before exporting objects."""
        self._bus.add_message_handler(self._on_message)
        await self._dbus_call("AddMatch", "s", [_NAME_OWNER_CHANGED])

    def stop(self) -> None:
        self._bus.remove_message_handler(self._on_message)

    def _on_message(self, msg: Message) -> None:
        # Returns None: the bus goes on to dispatch the message as usual.
        if msg.message_type is MessageType.METHOD_CALL:
            _current.set(msg)
        elif (
            msg.message_type is MessageType.SIGNAL
            and msg.member == "NameOwnerChanged"
            and msg.sender == DBUS_NAME
            and msg.body[2] == ""
        ):
            self._uids.pop(msg.body[0], None)
            self._groups.pop(msg.body[0], None)

    async def uid(self, sender: str) -> int:
        if sender not in self._uids:
            reply = await self._dbus_call("GetConnectionUnixUser", "s", [sender])
            self._uids[sender] = int(reply.body[0])
        return self._uids[sender]

    async def groups(self, sender: str) -> frozenset[int]:
        if sender not in self._groups:
            reply = await self._dbus_call("GetConnectionCredentials", "s", [sender])
            gids = reply.body[0].get("UnixGroupIDs")
            self._groups[sender] = frozenset(gids.value) if gids is not None else frozenset()
        return self._groups[sender]

    async def require_privileged(self, action: str) -> None:
        """Raise AccessDenied unless the current caller is root or in the allowed group,
        or when the bus daemon cannot say who the caller is (it may have left)."""
        msg = current_message()
        sender = msg.sender if msg is not None else None
        if not sender:
            # Not dispatched from the bus (no message): refuse rather than guess.
            raise AccessDenied(f"{action}: cannot identify the caller")
        try:
            if await self.uid(sender) == 0:
                return
            if self.allowed_gid is not None and self.allowed_gid in await self.groups(sender):
                return
        except RdmadError as exc:
            raise AccessDenied(f"{action}: cannot identify the caller: {exc}") from exc
        raise AccessDenied(f"{action} needs root or membership of the configured group")

    async def _dbus_call(self, member: str, signature: str, body: list[object]) -> Message:
        """Call the bus daemon; its refusal, no reply or a lost connection (EOFError,
        OSError) is an RdmadError."""
        try:
            reply = await self._bus.call(
                Message(
                    destination=DBUS_NAME,
                    path=DBUS_PATH,
                    interface=DBUS_NAME,
                    member=member,
                    signature=signature,
                    body=body,
                )
            )
        except (EOFError, OSError) as exc:
            raise RdmadError(f"the bus daemon's {member} failed: {exc!r}") from exc
        if reply is None or reply.message_type is MessageType.ERROR:
            name = reply.error_name if reply is not None else "no reply"
            raise RdmadError(f"the bus daemon's {member} failed: {name}")
        return reply
