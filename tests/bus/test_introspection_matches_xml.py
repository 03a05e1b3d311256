"""The live Introspect() output of each object matches dbus/*.xml (doc comments aside)."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from rdmad.bus.names import CLAIM_IFACE, DEVICE_IFACE, MANAGER_IFACE, MANAGER_PATH
from tests.bus.conftest import Live

DBUS_DIR = Path(__file__).resolve().parents[2] / "dbus"

Shape = dict[str, object]


def _annotations(el: ET.Element) -> list[tuple[str | None, str | None]]:
    return sorted((a.get("name"), a.get("value")) for a in el.findall("annotation"))


def _args(el: ET.Element, default_direction: str) -> list[tuple[str | None, str]]:
    # Out-arg and signal-arg names are documentation only (dbus-fast cannot emit them);
    # in-arg names are compared.
    out = []
    for a in el.findall("arg"):
        direction = a.get("direction", default_direction)
        out.append((a.get("type"), direction, a.get("name") if direction == "in" else None))
    return out  # type: ignore[return-value]


def interface_shape(xml: str, name: str) -> Shape:
    iface = next(i for i in ET.fromstring(xml).findall("interface") if i.get("name") == name)
    return {
        "methods": {
            m.get("name"): (_args(m, "in"), _annotations(m)) for m in iface.findall("method")
        },
        "signals": {
            s.get("name"): (_args(s, "out"), _annotations(s)) for s in iface.findall("signal")
        },
        "properties": {
            p.get("name"): (p.get("type"), p.get("access"), _annotations(p))
            for p in iface.findall("property")
        },
        "annotations": _annotations(iface),
    }


async def _introspect(live: Live, path: str) -> str:
    (xml,) = await live.call(
        "Introspect", path=path, interface="org.freedesktop.DBus.Introspectable"
    )
    return str(xml)


async def _claim_path(live: Live) -> str:
    from dbus_fast import Variant

    (path,) = await live.call("Claim", "ssa{sv}", ["mlx5_0", "ns1", {"shared": Variant("b", True)}])
    return str(path)


@pytest.mark.parametrize("iface", [MANAGER_IFACE, DEVICE_IFACE, CLAIM_IFACE])
async def test_live_introspection_matches_the_shipped_xml(live: Live, iface: str) -> None:
    if iface == MANAGER_IFACE:
        path = MANAGER_PATH
    elif iface == DEVICE_IFACE:
        (path,) = await live.call("GetDevice", "s", ["mlx5_0"])
    else:
        path = await _claim_path(live)
    shipped = (DBUS_DIR / f"{iface}.xml").read_text()
    assert interface_shape(await _introspect(live, path), iface) == interface_shape(shipped, iface)


async def test_manager_object_implements_object_manager(live: Live) -> None:
    root = ET.fromstring(await _introspect(live, MANAGER_PATH))
    names = {i.get("name") for i in root.findall("interface")}
    assert "org.freedesktop.DBus.ObjectManager" in names


@pytest.mark.parametrize("iface", [MANAGER_IFACE, DEVICE_IFACE, CLAIM_IFACE])
def test_every_member_in_the_xml_has_a_doc_comment(iface: str) -> None:
    text = (DBUS_DIR / f"{iface}.xml").read_text()
    lines = text.splitlines()
    for i, line in enumerate(lines):
        stripped = line.strip()
        if stripped.startswith(("<method", "<signal", "<property")):
            before = "\n".join(lines[max(0, i - 30) : i]).rstrip()
            assert before.endswith("-->"), f"{iface}: no doc comment before {stripped}"
