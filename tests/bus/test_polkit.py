"""rdmad asks the real polkitd (Debian's) whether a caller that is not root may change
state, with rules files as an admin writes them; root is never asked about. A caller that
is not root claims only into a netns of its own and releases only its own claims."""

from __future__ import annotations

import asyncio
import logging
import signal
import subprocess
from collections.abc import AsyncIterator, Iterator

import pytest
from dbus_fast import Message, MessageType
from dbus_fast.aio import MessageBus

from rdmad.bus.names import CLAIM_IFACE, MANAGER_IFACE, MANAGER_PATH
from rdmad.bus.polkit import POLKIT_IFACE, POLKIT_NAME
from testbed.bus import PrivateBus, private_bus, run_as, start_private_bus  # noqa: F401
from testbed.polkit import start_polkitd
from tests.bus.conftest import Live, start_live
from tests.bus.fakes import DAEMON, NOBODY, SYS
from tests.support.polkit import TEST_RULES

pytestmark = pytest.mark.usefixtures("root")  # polkitd's rules in /etc, calls as another uid

DENIED = "org.freedesktop.DBus.Error.AccessDenied"
# auth_admin: polkit would ask for a password, had the caller allowed it to
NOT_AUTHORIZED = (
    "not authorized by polkit (authentication is required: allow interactive authorization)"
)


def claim(device: str, netns: str, shared: bool) -> tuple[str, str, str, str, str]:
    body = f"[{device!r}, {netns!r}, {{'shared': Variant('b', {shared})}}]"
    return MANAGER_PATH, MANAGER_IFACE, "Claim", "ssa{sv}", body


SHARE = claim("mlx5_0", f"uid{NOBODY}", True)


class PolkitCalls:
    """Every CheckAuthorization on the bus, seen by an eavesdropping connection (which
    must not answer them: its handler takes them, or dbus-fast replies UnknownMethod)."""

    def __init__(self, bus: MessageBus) -> None:
        self._bus = bus
        self._seen: list[Message] = []
        bus.add_message_handler(self._on_message)

    def _on_message(self, msg: Message) -> bool:
        if msg.message_type is MessageType.METHOD_CALL and msg.interface == POLKIT_IFACE:
            self._seen.append(msg)
            return True
        return False

    async def made(self) -> list[Message]:
        """The calls made so far: a round trip to the bus daemon first, which answers
        after handing this connection every message it had for it before."""
        await self._bus.call(
            Message(
                destination="org.freedesktop.DBus",
                path="/org/freedesktop/DBus",
                interface="org.freedesktop.DBus",
                member="GetId",
            )
        )
        return list(self._seen)


@pytest.fixture(scope="module")
def polkit_bus() -> Iterator[PrivateBus]:
    """A private system bus with polkitd on it, under TEST_RULES."""
    with start_private_bus() as bus, start_polkitd(bus, TEST_RULES):
        yield bus


@pytest.fixture
async def live(polkit_bus: PrivateBus) -> AsyncIterator[Live]:
    async for value in start_live(polkit_bus.address):
        yield value


@pytest.fixture
async def polkit_calls(polkit_bus: PrivateBus) -> AsyncIterator[PolkitCalls]:
    bus = await MessageBus(bus_address=polkit_bus.address).connect()
    rule = f"eavesdrop=true,type='method_call',interface='{POLKIT_IFACE}'"
    await bus.call(
        Message(
            destination="org.freedesktop.DBus",
            path="/org/freedesktop/DBus",
            interface="org.freedesktop.DBus",
            member="AddMatch",
            signature="s",
            body=[rule],
        )
    )
    yield PolkitCalls(bus)
    bus.disconnect()


async def test_root_changes_state_without_a_polkit_call(
    live: Live, polkit_calls: PolkitCalls
) -> None:
    from dbus_fast import Variant

    await live.call("Claim", "ssa{sv}", ["mlx5_0", "ns1", {"netdev": Variant("b", False)}])
    await live.call("SetNetnsMode", "s", ["exclusive"])
    assert await polkit_calls.made() == []
    assert [c.claimant for c in live.core.claims()] == [0]


async def test_a_caller_no_rule_allows_is_refused_by_the_defaults(
    live: Live, polkit_calls: PolkitCalls
) -> None:
    got = await run_as(live.address, *claim("mlx5_0", f"uid{SYS}", True), uid=SYS, message=True)
    assert got == f"{DENIED}: io.rdmad1.claim-share: {NOT_AUTHORIZED}"
    assert live.core.claims() == []
    (asked,) = await polkit_calls.made()  # one round trip
    subject, action, details, flags, _ = asked.body
    assert subject[0] == "system-bus-name"
    assert (action, details, flags) == (
        "io.rdmad1.claim-share",
        {"device": "mlx5_0", "netns": f"uid{SYS}"},
        0,
    )


async def test_a_group_rule_allows_shares_but_not_whole_devices(live: Live) -> None:
    assert await run_as(live.address, *SHARE) == "ok"
    whole = claim("mlx5_0", f"uid{NOBODY}", False)
    got = await run_as(live.address, *whole, message=True)
    assert got == f"{DENIED}: io.rdmad1.claim-device: {NOT_AUTHORIZED}"
    assert [(c.shared, c.claimant) for c in live.core.claims()] == [(True, NOBODY)]


@pytest.mark.parametrize(("device", "allowed"), [("mlx5_0", True), ("mlx5_2", False)])
async def test_a_rule_by_device(live: Live, device: str, allowed: bool) -> None:
    got = await run_as(live.address, *claim(device, f"uid{DAEMON}", False), uid=DAEMON)
    assert got == ("ok" if allowed else DENIED)
    assert [c.claimant for c in live.core.claims()] == ([DAEMON] if allowed else [])


@pytest.mark.parametrize("netns", ["ns1", f"uid{DAEMON}"], ids=["roots", "another-users"])
async def test_a_caller_claims_only_into_a_netns_of_its_own(live: Live, netns: str) -> None:
    got = await run_as(live.address, *claim("mlx5_0", netns, True), message=True)
    assert got.startswith(f"{DENIED}: {netns} is not uid {NOBODY}'s")
    assert live.core.claims() == []


@pytest.mark.parametrize("how", ["Manager", "Claim"])
async def test_a_caller_releases_its_own_claim(live: Live, how: str) -> None:
    assert await run_as(live.address, *SHARE) == "ok"
    (mine,) = live.core.claims()
    assert await run_as(live.address, *release(how, mine.id)) == "ok"
    assert live.core.claims() == []


@pytest.mark.parametrize("how", ["Manager", "Claim"])
async def test_a_caller_may_not_release_anothers_claim(live: Live, how: str) -> None:
    from dbus_fast import Variant

    await live.call("Claim", "ssa{sv}", ["mlx5_0", "ns1", {"shared": Variant("b", True)}])
    (roots,) = live.core.claims()
    got = await run_as(live.address, *release(how, roots.id), message=True)
    assert got == f"{DENIED}: io.rdmad1.release-any: {NOT_AUTHORIZED}"
    assert live.core.claims() == [roots]


def release(how: str, claim_id: str) -> tuple[str, ...]:
    if how == "Manager":
        return MANAGER_PATH, MANAGER_IFACE, "Release", "s", f"[{claim_id!r}]"
    return f"{MANAGER_PATH}/claim/{claim_id}", CLAIM_IFACE, "Release", "", "[]"


async def test_without_polkitd_only_root_changes_state_as_said_at_start(
    private_bus: PrivateBus,  # noqa: F811
    caplog: pytest.LogCaptureFixture,
) -> None:
    from dbus_fast import Variant

    with caplog.at_level(logging.WARNING, logger="rdmad.bus.polkit"):
        async for live in start_live(private_bus.address):
            got = await run_as(live.address, *SHARE, message=True)
            await live.call("Claim", "ssa{sv}", ["mlx5_0", "ns1", {"shared": Variant("b", True)}])
            assert [c.claimant for c in live.core.claims()] == [0]
    assert got.startswith(f"{DENIED}: io.rdmad1.claim-share: polkit could not be asked")
    said = [r.getMessage() for r in caplog.records if r.name == "rdmad.bus.polkit"]
    assert said == [f"polkitd ({POLKIT_NAME}) is not on the bus: only root may change state"]


@pytest.mark.parametrize("fate", ["stopped", "killed"])
async def test_a_polkitd_that_stops_or_dies_leaves_root_only_without_a_hang(fate: str) -> None:
    from dbus_fast import Variant

    bound = 0.5
    with start_private_bus() as bus, start_polkitd(bus, TEST_RULES) as polkitd:
        async for live in start_live(bus.address, bound):
            polkitd.send_signal(signal.SIGSTOP if fate == "stopped" else signal.SIGKILL)
            async with asyncio.timeout(10 * bound + 5):  # the caller's own start included
                got = await run_as(live.address, *SHARE, message=True)
            await live.call("Claim", "ssa{sv}", ["mlx5_0", "ns1", {"shared": Variant("b", True)}])
            assert [c.claimant for c in live.core.claims()] == [0]
            polkitd.send_signal(signal.SIGCONT)
    reason = f"did not answer within {bound:g} s" if fate == "stopped" else "could not be asked"
    assert got.startswith(f"{DENIED}: io.rdmad1.claim-share: polkit {reason}")


async def test_a_callers_interactive_authorization_flag_is_passed_on(
    live: Live, polkit_calls: PolkitCalls
) -> None:
    # busctl allows interactive authorization by default; no polkit agent is running
    proc = await asyncio.create_subprocess_exec(
        "busctl",
        f"--address={live.address}",
        "--allow-interactive-authorization=yes",
        "call",
        *("io.rdmad1", MANAGER_PATH, MANAGER_IFACE, "Claim", "ssa{sv}"),
        *("mlx5_0", f"uid{SYS}", "1", "shared", "b", "true"),
        user=SYS,
        group=NOBODY,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    async with asyncio.timeout(30):
        _, err = await proc.communicate()
    assert proc.returncode != 0
    assert err.decode() == "Call failed: Access denied\n"  # busctl's words for AccessDenied
    (asked,) = await polkit_calls.made()
    assert asked.body[3] == 1  # AllowUserInteraction
    assert live.core.claims() == []


def pod_call(member: str, *args: str) -> tuple[str, str, str, str, str]:
    signature = {"Hold": "ssa{sv}", "Attach": "ssa{sv}", "Detach": "s"}[member]
    body = f"[{', '.join(repr(a) for a in args)}{', {}' if signature.endswith('}') else ''}]"
    return MANAGER_PATH, MANAGER_IFACE, member, signature, body


async def test_a_caller_holds_attaches_and_detaches_for_its_pod(
    live: Live, polkit_calls: PolkitCalls
) -> None:
    assert await run_as(live.address, *pod_call("Hold", "mlx5_0", "pod-1")) == "ok"
    assert await run_as(live.address, *pod_call("Attach", "pod-1", f"uid{NOBODY}")) == "ok"
    (held,) = live.core.claims()
    assert (held.claimant, held.phase) == (NOBODY, "active")
    assert await run_as(live.address, *pod_call("Detach", held.id)) == "ok"
    assert held.phase == "held"
    assert [(c.body[1], c.body[2]) for c in await polkit_calls.made()] == [
        ("io.rdmad1.hold", {"device": "mlx5_0", "pod_uid": "pod-1"}),
        ("io.rdmad1.hold", {"pod_uid": "pod-1", "netns": f"uid{NOBODY}"}),
        ("io.rdmad1.hold", {"claim": held.id, "device": "mlx5_0"}),
    ]


async def test_a_caller_may_not_attach_or_detach_anothers_hold(live: Live) -> None:
    await live.call("Hold", "ssa{sv}", ["mlx5_0", "pod-1", {}])
    (roots,) = live.core.claims()
    got = await run_as(live.address, *pod_call("Attach", "pod-1", f"uid{NOBODY}"), message=True)
    assert got == f"{DENIED}: io.rdmad1.hold: pod pod-1's holds {roots.id} are not uid {NOBODY}'s"
    await live.call("Attach", "ssa{sv}", ["pod-1", "ns1", {}])
    got = await run_as(live.address, *pod_call("Detach", roots.id), message=True)
    assert got == f"{DENIED}: io.rdmad1.release-any: {NOT_AUTHORIZED}"
    assert roots.phase == "active"
