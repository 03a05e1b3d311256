"""Who may do what, against the real daemon without polkitd: a real uid != 0 (nobody) is
refused every mutating method with AccessDenied, by the daemon (the shipped bus policy lets
anyone call), under the shipped bus policy and on a bus that lets everyone through. Reads
work."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from testbed.bus import PrivateBus, policy_bus, private_bus, run_as  # noqa: F401
from testbed.net import link
from tests.reliability.conftest import reliability_rig, settings_of
from tests.support.invariants import assert_invariants
from tests.support.sim_rig import Rig

DENIED = "org.freedesktop.DBus.Error.AccessDenied"
MANAGER = ("/io/rdmad1", "io.rdmad1.Manager")


def mutating(netns: str, claim_path: str, claim_id: str) -> list[tuple[str, ...]]:
    """(path, interface, member, signature, body expression) of every state-changing call."""
    return [
        (*MANAGER, "Claim", "ssa{sv}", f"['sim1', '{netns}', {{}}]"),
        (*MANAGER, "ClaimFd", "sha{sv}", "['sim1', 0, {}]"),
        (*MANAGER, "Release", "s", f"['{claim_id}']"),
        (*MANAGER, "SetNetnsMode", "s", "['exclusive']"),
        (claim_path, "io.rdmad1.Claim", "Release", "", "[]"),
    ]


READS = [
    (*MANAGER, "ListDevices", "", "[]"),
    (*MANAGER, "GetDevice", "s", "['sim0']"),
    (*MANAGER, "ListClaims", "", "[]"),
    (
        "/io/rdmad1",
        "org.freedesktop.DBus.Properties",
        "Get",
        "ss",
        "['io.rdmad1.Manager', 'Version']",
    ),
    (
        "/io/rdmad1/device/sim0",
        "org.freedesktop.DBus.Properties",
        "GetAll",
        "s",
        "['io.rdmad1.Device']",
    ),
    ("/io/rdmad1", "org.freedesktop.DBus.Introspectable", "Introspect", "", "[]"),
]


@pytest.fixture(params=["policy", "daemon"])
async def guarded(
    request: pytest.FixtureRequest, tmp_path: Path, netns: str
) -> AsyncIterator[tuple[str, Rig]]:
    """`policy`: the shipped dbus/io.rdmad1.conf is loaded. `daemon`: a bus that allows
    everything. Either way the daemon's own check stands between nobody and a claim."""
    bus: PrivateBus = request.getfixturevalue(
        "policy_bus" if request.param == "policy" else "private_bus"
    )
    async with reliability_rig(bus.address, tmp_path, 2) as rig:
        yield request.param, rig


async def test_unprivileged_caller_is_refused_every_mutating_method_and_can_read(
    guarded: tuple[str, Rig], netns: str
) -> None:
    enforcer, rig = guarded
    settings = settings_of(rig.nics)
    path = await rig.client.manager("Claim", "ssa{sv}", "sim0", netns, {})
    claim_id = await rig.client.prop(path, "io.rdmad1.Claim", "Id")
    address = rig.daemon.bus_address
    refused = {}
    for call in mutating(netns, path, claim_id):
        refused[f"{call[1]}.{call[2]}"] = await run_as(address, *call)
    assert refused == dict.fromkeys(refused, DENIED), refused
    reads = {call[2]: await run_as(address, *call) for call in READS}
    assert reads == dict.fromkeys(reads, "ok"), reads
    # Nothing changed: the claim is still there, sim1 never moved, the mode is unchanged.
    assert [c[0] for c in await rig.client.manager("ListClaims")] == [claim_id]
    assert link(rig.nic("sim1")) is not None
    assert await rig.client.prop("/io/rdmad1", "io.rdmad1.Manager", "NetnsMode") == "shared"
    await assert_invariants(rig.client, rig.nics, {"sim1": settings["sim1"]}, [netns])
    print(
        f"access ({enforcer} enforces): uid {os.getuid()}->nobody: "
        f"{len(refused)} mutating calls -> AccessDenied, {len(reads)} reads -> ok"
    )
