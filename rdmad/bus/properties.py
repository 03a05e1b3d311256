"""D-Bus properties defined once, in a table, instead of once per use.

Each row names a read-only property, its D-Bus signature and how to read it from the
object's source (a DeviceView, a Claim, the core). From the table come the dbus-fast
properties (Get, GetAll, Introspect) and the typed variants that ObjectManager.InterfacesAdded
and PropertiesChanged carry. The documented contract is dbus/*.xml;
tests/bus/test_introspection_matches_xml.py checks that it matches what the table exports.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from dbus_fast import Variant
from dbus_fast.constants import PropertyAccess
from dbus_fast.service import ServiceInterface, dbus_property

S = TypeVar("S")


@dataclass(frozen=True)
class Prop(Generic[S]):
    name: str
    signature: str
    read: Callable[[S], Any]


class PropertyTable(Generic[S]):
    def __init__(self, *props: Prop[S]) -> None:
        self.props = props

    def values(self, source: S) -> dict[str, Any]:
        """Every property's value of `source`, untyped: what an object last announced."""
        return {p.name: p.read(source) for p in self.props}

    def typed(self, values: dict[str, Any]) -> dict[str, Variant]:
        """`values` (of values()), typed as InterfacesAdded carries them."""
        return {p.name: Variant(p.signature, values[p.name]) for p in self.props}

    def variants(self, source: S, *names: str) -> dict[str, Variant]:
        """The properties `names` of `source`, typed as PropertiesChanged carries them."""
        return {p.name: Variant(p.signature, p.read(source)) for p in self.props if p.name in names}

    def changed(self, shown: dict[str, Any], source: S) -> dict[str, Variant]:
        """The properties of `source` whose values differ from `shown` (values() as last
        announced, brought up to date here), typed for PropertiesChanged. Each is read
        once: the announced values are kept, not read again from an old source."""
        out: dict[str, Variant] = {}
        for p in self.props:
            value = p.read(source)
            if value != shown[p.name]:
                shown[p.name] = value
                out[p.name] = Variant(p.signature, value)
        return out

    def export_on(self, cls: type[ServiceInterface], source: Callable[[Any], S]) -> None:
        """Give `cls` one read-only dbus-fast property per row, reading `source(self)`.

        dbus-fast finds properties on the class when an instance is built, and reads the
        signature from the getter's return annotation, which may be a signature string."""
        for prop in self.props:
            if hasattr(cls, prop.name):
                raise TypeError(f"{cls.__name__}.{prop.name} is already defined")
            setattr(cls, prop.name, _exported(prop, source))


def _exported(prop: Prop[S], source: Callable[[Any], S]) -> Any:
    def getter(self: ServiceInterface) -> Any:
        return prop.read(source(self))

    getter.__name__ = getter.__qualname__ = prop.name
    getter.__annotations__ = {"return": prop.signature}
    return dbus_property(access=PropertyAccess.READ, name=prop.name)(getter)
