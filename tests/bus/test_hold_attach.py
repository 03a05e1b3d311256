"""Manager.Hold and Manager.Attach at the bus edge: their arguments, options and replies,
and what a held claim's object shows before and after its Attach (the core is a fake)."""

from __future__ import annotations

from ipaddress import ip_interface

import pytest
from dbus_fast import Message, Variant
from dbus_fast.errors import DBusError

from rdmad.bus.names import CLAIM_IFACE, PROPERTIES_IFACE
from rdmad.errors import InvalidArgs
from rdmad.model import ClaimOptions
from tests.bus.conftest import Live

POD = "0f6a2c44-7d1e-4c8e-9a55-3b7e1c2d9f10"


async def _hold(live: Live, **options: Variant) -> str:
    (path,) = await live.call("Hold", "ssa{sv}", ["mlx5_0", POD, options])
    return str(path)


async def test_a_hold_is_a_claim_object_held_for_its_pod_with_no_netns(live: Live) -> None:
    path = await _hold(live, ifname=Variant("s", "net0"))
    props = await live.get_all(path, CLAIM_IFACE)
    assert (props["State"], props["PodUid"], props["Netns"]) == ("held", POD, "")
    assert props["CdiDevice"].startswith("rdmad.io/rdma=")
    (claims,) = await live.call("ListClaims")
    assert [(c[0], c[2], c[5]) for c in claims] == [(props["Id"], "", path)]


async def test_attach_returns_the_paths_of_the_pods_claims(live: Live) -> None:
    path = await _hold(live)
    options = {"addresses": Variant("as", ["10.0.0.5/24"])}
    (paths,) = await live.call("Attach", "ssa{sv}", [POD, "ns1", options])
    assert paths == [path]
    assert live.core.last_options == ClaimOptions(addresses=(ip_interface("10.0.0.5/24"),))


async def test_attach_of_a_pod_that_holds_nothing_returns_no_path(live: Live) -> None:
    (paths,) = await live.call("Attach", "ssa{sv}", ["another-pod", "ns1", {}])
    assert paths == []


async def test_attach_announces_what_it_changed_on_the_claim(live: Live) -> None:
    path = await _hold(live)
    await live.call("Attach", "ssa{sv}", [POD, "ns1", {}])

    def changed(msg: Message) -> bool:
        return msg.path == path and msg.interface == PROPERTIES_IFACE

    msg = await live.wait_signal(changed)
    iface, props, _ = msg.body
    assert iface == CLAIM_IFACE
    assert props["State"].value == "active" and props["Netns"].value.startswith("net:[")


async def test_an_attach_option_it_does_not_take_is_invalid_args(
    live: Live,
) -> None:
    with pytest.raises(DBusError) as caught:
        await live.call("Attach", "ssa{sv}", [POD, "ns1", {"mtu": Variant("u", 9000)}])
    assert caught.value.type == InvalidArgs.dbus_name
    assert caught.value.text == (
        "unknown attach option 'mtu' (known: ifname, addresses, cgroup, hca_handles, hca_objects)"
    )
