"""Who is calling: the sender of the method call being handled, its uid, and whether
polkit lets it do what it asks (rdmad.bus.polkit).

dbus-fast method handlers get only the arguments. The bus runs user message handlers
(BaseMessageBus.add_message_handler) synchronously just before it dispatches a call, and
a coroutine method runs in a Task whose context is copied when the Task is created, so a
ContextVar set in that handler is what the method sees as "the message I am handling".
"""

from __future__ import annotations

from contextvars import ContextVar

from dbus_fast import Message, MessageFlag, MessageType
from dbus_fast.aio import MessageBus

from rdmad.bus.names import DBUS_NAME, bus_daemon_call, name_owner_changed_rule
from rdmad.bus.polkit import Action, Polkit
from rdmad.errors import AccessDenied, RdmadError

_current: ContextVar[Message | None] = ContextVar("rdmad_current_message", default=None)


def current_message() -> Message | None:
    """The method call being handled in this task, None outside a handler."""
    return _current.get()


class Credentials:
    """Looks up (and caches per unique name) the unix uid of bus peers, and asks polkit
    about those that are not root."""

    def __init__(self, bus: MessageBus, polkit: Polkit) -> None:
        self._bus = bus
        self._polkit = polkit
        self._uids: dict[str, int] = {}

    async def start(self) -> None:
        """Hook into dispatch and watch for peers leaving. Call before exporting objects."""
        self._bus.add_message_handler(self._on_message)
        await self._dbus_call("AddMatch", "s", [name_owner_changed_rule()])
        await self._polkit.start()

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

    async def uid(self, sender: str) -> int:
        if sender not in self._uids:
            reply = await self._dbus_call("GetConnectionUnixUser", "s", [sender])
            self._uids[sender] = int(reply.body[0])
        return self._uids[sender]

    async def caller_uid(self, action: Action) -> int:
        """The uid of the current caller; AccessDenied (naming `action`) when the bus
        daemon cannot say (the caller may have left), or outside a call."""
        return await self._uid_of(self._call(action), action)

    async def authorize(self, action: Action, details: dict[str, str]) -> int:
        """The current caller's uid, once it may do `action`: root always, anyone else if
        polkit says so (asked with `details`, and allowed to ask for a password if the
        call carries ALLOW_INTERACTIVE_AUTHORIZATION). Raises AccessDenied otherwise."""
        msg = self._call(action)
        sender = msg.sender or ""  # _call checked it
        uid = await self._uid_of(msg, action)
        if uid != 0:
            interactive = bool(msg.flags & MessageFlag.ALLOW_INTERACTIVE_AUTHORIZATION)
            await self._polkit.check(sender, action, details, interactive)
        return uid

    def _call(self, action: Action) -> Message:
        """The method call being handled, with its sender."""
        msg = current_message()
        if msg is None or not msg.sender:
            # Not dispatched from the bus (no message): refuse rather than guess.
            raise AccessDenied(f"{action}: cannot identify the caller")
        return msg

    async def _uid_of(self, msg: Message, action: Action) -> int:
        try:
            return await self.uid(msg.sender or "")
        except RdmadError as exc:
            raise AccessDenied(f"{action}: cannot identify the caller: {exc}") from exc

    async def _dbus_call(self, member: str, signature: str, body: list[object]) -> Message:
        """Call the bus daemon; its refusal, no reply or a lost connection (EOFError,
        OSError) is an RdmadError."""
        try:
            reply = await self._bus.call(bus_daemon_call(member, signature, body))
        except (EOFError, OSError) as exc:
            raise RdmadError(f"the bus daemon's {member} failed: {exc!r}") from exc
        if reply is None or reply.message_type is MessageType.ERROR:
            name = reply.error_name if reply is not None else "no reply"
            raise RdmadError(f"the bus daemon's {member} failed: {name}")
        return reply
