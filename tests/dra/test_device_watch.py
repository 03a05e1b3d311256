"""Which of rdmad's signals make rdmad-dra re-read it: those that can change the offer, and
not the rest of a claim's traffic (rdmad/dra/device_watch.py)."""

from __future__ import annotations

from typing import Any

import pytest
from dbus_fast import Message, MessageType, Variant

from rdmad.bus.names import (
    CLAIM_IFACE,
    DBUS_NAME,
    DBUS_PATH,
    DEVICE_IFACE,
    MANAGER_IFACE,
    MANAGER_PATH,
    OBJECT_MANAGER_IFACE,
    PROPERTIES_IFACE,
    claim_path,
    device_path,
)
from rdmad.dra.device_watch import changes_offer


def signal(path: str, interface: str, member: str, signature: str, body: list[Any]) -> Message:
    return Message(
        message_type=MessageType.SIGNAL,
        path=path,
        interface=interface,
        member=member,
        signature=signature,
        body=body,
    )


STATE = {"State": Variant("s", "shared")}
CHANGES_OFFER = {
    "device state": signal(
        device_path("mlx5_0"),
        PROPERTIES_IFACE,
        "PropertiesChanged",
        "sa{sv}as",
        [DEVICE_IFACE, STATE, []],
    ),
    "device added": signal(
        MANAGER_PATH,
        OBJECT_MANAGER_IFACE,
        "InterfacesAdded",
        "oa{sa{sv}}",
        [device_path("mlx5_1"), {DEVICE_IFACE: STATE}],
    ),
    "device removed": signal(
        MANAGER_PATH,
        OBJECT_MANAGER_IFACE,
        "InterfacesRemoved",
        "oas",
        [device_path("mlx5_1"), [DEVICE_IFACE]],
    ),
    "netns mode": signal(
        MANAGER_PATH,
        PROPERTIES_IFACE,
        "PropertiesChanged",
        "sa{sv}as",
        [MANAGER_IFACE, {"NetnsMode": Variant("s", "exclusive")}, []],
    ),
    "rdmad came or went": signal(
        DBUS_PATH, DBUS_NAME, "NameOwnerChanged", "sss", ["io.rdmad1", "", ":1.7"]
    ),
}
LEAVES_OFFER = {
    "claim's gids": signal(
        claim_path("00000000000000aa"),
        PROPERTIES_IFACE,
        "PropertiesChanged",
        "sa{sv}as",
        [CLAIM_IFACE, {"Gids": Variant("a(uusss)", [])}, []],
    ),
    "claim added": signal(
        MANAGER_PATH,
        OBJECT_MANAGER_IFACE,
        "InterfacesAdded",
        "oa{sa{sv}}",
        [claim_path("00000000000000aa"), {CLAIM_IFACE: {}}],
    ),
    "claimed": signal(
        MANAGER_PATH,
        MANAGER_IFACE,
        "Claimed",
        "sso",
        ["00000000000000aa", "mlx5_0", claim_path("00000000000000aa")],
    ),
    "another name's owner": signal(
        DBUS_PATH, DBUS_NAME, "NameOwnerChanged", "sss", ["org.example", "", ":1.8"]
    ),
}


@pytest.mark.parametrize("what", CHANGES_OFFER)
def test_a_signal_that_can_change_the_offer_makes_it_stale(what: str) -> None:
    assert changes_offer(CHANGES_OFFER[what])


@pytest.mark.parametrize("what", LEAVES_OFFER)
def test_a_claims_own_traffic_does_not(what: str) -> None:
    assert not changes_offer(LEAVES_OFFER[what])
