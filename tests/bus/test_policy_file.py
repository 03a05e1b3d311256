"""The shipped bus policy loads in dbus-daemon: anyone may call rdmad, which decides who
may change state (here, without polkitd, root only)."""

from __future__ import annotations

import pytest

from rdmad.bus.names import CLAIM_IFACE, MANAGER_IFACE, MANAGER_PATH, PROPERTIES_IFACE
from testbed.bus import PrivateBus, run_as
from tests.bus.conftest import Live


def test_dbus_daemon_starts_with_the_shipped_policy_included(policy_bus: PrivateBus) -> None:
    assert policy_bus.process.poll() is None
    assert policy_bus.address.startswith("unix:path=")


@pytest.mark.usefixtures("root")  # the caller is this process
async def test_root_may_claim_under_the_shipped_policy(live_policy: Live) -> None:
    from dbus_fast import Variant

    (path,) = await live_policy.call(
        "Claim", "ssa{sv}", ["mlx5_0", "ns1", {"shared": Variant("b", True)}]
    )
    assert path.startswith("/io/rdmad1/claim/")


@pytest.mark.usefixtures("root")  # run_as: a call as another uid
@pytest.mark.parametrize(
    ("interface", "member", "signature", "body"),
    [
        (MANAGER_IFACE, "ListDevices", "", "[]"),
        (MANAGER_IFACE, "GetDevice", "s", "['mlx5_0']"),
        (MANAGER_IFACE, "ListClaims", "", "[]"),
        (MANAGER_IFACE, "GetStatistics", "", "[]"),
        (PROPERTIES_IFACE, "GetAll", "s", f"['{MANAGER_IFACE}']"),
        ("org.freedesktop.DBus.Introspectable", "Introspect", "", "[]"),
        ("org.freedesktop.DBus.ObjectManager", "GetManagedObjects", "", "[]"),
    ],
)
async def test_anyone_may_read(
    live_policy: Live, interface: str, member: str, signature: str, body: str
) -> None:
    assert (
        await run_as(live_policy.address, MANAGER_PATH, interface, member, signature, body) == "ok"
    )


@pytest.mark.usefixtures("root")  # run_as: a call as another uid
@pytest.mark.parametrize(
    ("path", "interface", "member", "signature", "body"),
    [
        (MANAGER_PATH, MANAGER_IFACE, "Claim", "ssa{sv}", "['mlx5_0', 'uid65534', {}]"),
        (MANAGER_PATH, MANAGER_IFACE, "Release", "s", "['c1']"),
        (MANAGER_PATH, MANAGER_IFACE, "Detach", "s", "['c1']"),
        (MANAGER_PATH, MANAGER_IFACE, "SetNetnsMode", "s", "['exclusive']"),
        ("/io/rdmad1/claim/c1", CLAIM_IFACE, "Release", "", "[]"),
    ],
)
async def test_the_bus_lets_other_users_reach_rdmad_which_refuses_them(
    live_policy: Live, path: str, interface: str, member: str, signature: str, body: str
) -> None:
    from dbus_fast import Variant

    await live_policy.call("Claim", "ssa{sv}", ["mlx5_0", "ns1", {"shared": Variant("b", True)}])
    roots = live_policy.core.claims()  # c1
    got = await run_as(live_policy.address, path, interface, member, signature, body, message=True)
    # rdmad's refusal names a polkit action; the bus's would not
    assert got.startswith("org.freedesktop.DBus.Error.AccessDenied: io.rdmad1."), got
    assert live_policy.core.netns_mode == "shared"
    assert live_policy.core.claims() == roots
