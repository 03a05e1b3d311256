"""D-Bus signals declared once: each Signal builds the message rdmad sends and, for rdmad's
own interfaces, the @dbus_signal declaration that Introspect lists.

rdmad sends every signal itself, from the object path it already knows, with the public
MessageBus.send. Calling a @dbus_signal method or emit_properties_changed instead makes
dbus-fast look for the object's path by searching every exported object: a cost per signal
that grows with the node (docs/kernel-notes.md, "dbus-fast").
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any, Generic, TypeVar

from dbus_fast import Message, Variant
from dbus_fast.annotations import DBusSignature
from dbus_fast.service import ServiceInterface, dbus_signal

from rdmad.bus.names import OBJECT_MANAGER_IFACE, PROPERTIES_IFACE

Body = TypeVar("Body", bound=tuple[Any, ...])


@dataclass(frozen=True)
class Signal(Generic[Body]):
    interface: str
    name: str
    signature: str

    def message(self, path: str, body: Body) -> Message:
        """The signal as sent from the object at `path`."""
        return Message.new_signal(path, self.interface, self.name, self.signature, list(body))

    def declare_on(self, cls: type[ServiceInterface]) -> None:
        """Give `cls` the @dbus_signal member that Introspect lists, with this signature.

        It is a declaration only, never called: calling it would send the signal through
        dbus-fast's search of every export."""
        if hasattr(cls, self.name):
            raise TypeError(f"{cls.__name__}.{self.name} is already defined")

        def declaration(interface: ServiceInterface) -> None:
            """Introspection's copy of the signal; rdmad sends it with Signal.message."""

        declaration.__name__ = declaration.__qualname__ = self.name
        # dbus-fast reads a signal's signature from its return annotation.
        declaration.__annotations__ = {"return": Annotated[Any, DBusSignature(self.signature)]}
        setattr(cls, self.name, dbus_signal(name=self.name)(declaration))


# The standard interfaces' signals, for rdmad's objects (dbus-fast declares these itself).
PROPERTIES_CHANGED: Signal[tuple[str, dict[str, Variant], list[str]]] = Signal(
    PROPERTIES_IFACE, "PropertiesChanged", "sa{sv}as"
)
INTERFACES_ADDED: Signal[tuple[str, dict[str, dict[str, Variant]]]] = Signal(
    OBJECT_MANAGER_IFACE, "InterfacesAdded", "oa{sa{sv}}"
)
INTERFACES_REMOVED: Signal[tuple[str, list[str]]] = Signal(
    OBJECT_MANAGER_IFACE, "InterfacesRemoved", "oas"
)
