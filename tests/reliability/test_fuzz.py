"""Hostile input through the real bus (hypothesis): every method and option, random and
oversized strings, wrong variant types, unknown options, paths to non-netns files,
directories, FIFOs, init_net, symlinks, pid: of dead or foreign processes, non-netns fds via
ClaimFd, wrong signatures. Every call gets a named error, the daemon stays up, nothing moves.

Each runs twice (`target`'s params): as root, whom rdmad never asks about, and with polkit
in the path: as nobody, whom the real polkitd's rule allows every action, so that every
call is checked by polkit (and a claim into root's netns is AccessDenied after it).

Hypothesis drives a plain function, so the examples run in a worker thread with its own
event loop and bus connection (the daemon is another process: nothing is shared but the
bus). One daemon serves each run of the module: a call that changes nothing cannot leak
state.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import subprocess
import tempfile
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from dbus_fast import Variant
from dbus_fast.errors import InvalidMessageError
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from testbed.bus import NOBODY, start_private_bus, this_thread_as
from testbed.daemon import BUS_NAME, MANAGER_IFACE, MANAGER_PATH, Client, DBusCallError
from testbed.net import temp_netns
from testbed.polkit import start_polkitd
from tests.reliability.conftest import reliability_rig, settings_of
from tests.support.invariants import HostSettings, assert_invariants, host_settings
from tests.support.sim_rig import Rig

EXAMPLES = 60
NOT_SENDABLE = "(not sendable: invalid D-Bus string)"
FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow],
)
# Named errors a bad call may get; anything else (Failed, NoReply, a success) is a bug.
NAMED = {
    "org.freedesktop.DBus.Error.InvalidArgs",
    "org.freedesktop.DBus.Error.InvalidSignature",
    "org.freedesktop.DBus.Error.UnknownMethod",
    "io.rdmad1.Error.NoSuchDevice",
    "io.rdmad1.Error.NoSuchClaim",
    "io.rdmad1.Error.InvalidNetns",
    "io.rdmad1.Error.DeviceBusy",
    "io.rdmad1.Error.ModeBusy",
    "io.rdmad1.Error.NotSupported",
    NOT_SENDABLE,
}
DENIED = "org.freedesktop.DBus.Error.AccessDenied"
# polkit in the path: nobody may do everything polkit decides (not claim into root's netns)
ALLOW_NOBODY = """
polkit.addRule(function(action, subject) {
    if (action.id.indexOf("io.rdmad1.") == 0 && subject.user == "nobody")
        return polkit.Result.YES;
});
"""


@dataclass
class Fuzzer:
    """A bus connection on a private loop in the calling thread; records every outcome."""

    address: str
    uid: int = 0  # the caller's
    loop: asyncio.AbstractEventLoop = field(default_factory=asyncio.new_event_loop)
    client: Client | None = None
    outcomes: dict[str, int] = field(default_factory=dict)

    def call(
        self,
        member: str,
        sig: str,
        body: list[Any],
        fds: list[int] | None = None,
        path: str = MANAGER_PATH,
        iface: str = MANAGER_IFACE,
    ) -> str:
        if self.client is None:
            with this_thread_as(self.uid) if self.uid else contextlib.nullcontext():
                self.client = self.loop.run_until_complete(Client.connect(self.address))
        call = self.client.call_raw(BUS_NAME, path, iface, member, sig, body, fds)
        try:
            self.loop.run_until_complete(asyncio.wait_for(call, 30))
            result = "ok"
        except DBusCallError as e:
            result = e.name
        except (InvalidMessageError, UnicodeEncodeError):
            # NUL and lone surrogates cannot be put on the wire (D-Bus strings are UTF-8
            # without NUL): the client library refuses; dbus-daemon would drop such a message.
            result = NOT_SENDABLE
        self.outcomes[result] = self.outcomes.get(result, 0) + 1
        return result

    def uid_on_the_bus(self) -> int:
        """The uid the bus daemon has for this connection (rdmad and polkit ask it)."""
        self.call("GetManagedObjects", "", [], iface="org.freedesktop.DBus.ObjectManager")
        assert self.client is not None
        dbus = ("org.freedesktop.DBus", "/org/freedesktop/DBus", "org.freedesktop.DBus")
        call = self.client.call_raw(
            *dbus, "GetConnectionUnixUser", "s", [self.client.bus.unique_name]
        )
        (uid,) = self.loop.run_until_complete(call)
        return int(uid)

    def close(self) -> None:
        if self.client is not None:
            self.client.close()
        self.loop.close()


@dataclass
class Target:
    rig: Rig
    netns: str
    settings: dict[str, HostSettings]
    specials: list[str]
    uid: int  # the caller's
    named: set[str]  # the errors a bad call may get


@contextlib.contextmanager
def caller_bus(caller: str, bus_address: str) -> Iterator[tuple[str, int, set[str]]]:
    """The bus, the caller's uid and the named errors: root's on the session's bus, or
    nobody's on a bus with polkitd under ALLOW_NOBODY."""
    if caller == "root":
        yield bus_address, 0, NAMED
        return
    with start_private_bus() as bus, start_polkitd(bus, ALLOW_NOBODY):
        yield bus.address, NOBODY, NAMED | {DENIED}


@contextlib.contextmanager
def special_paths() -> Iterator[list[str]]:
    """Paths that are not a usable netns, each a trick a caller might try."""
    with tempfile.TemporaryDirectory() as d:
        fifo = Path(d) / "fifo"
        os.mkfifo(fifo)
        links = {
            "to-init": "/proc/self/ns/net",
            "loop-a": f"{d}/loop-b",
            "loop-b": f"{d}/loop-a",
            "to-etc": "/etc/passwd",
            "dangling": f"{d}/none",
        }
        for name, dest in links.items():
            os.symlink(dest, Path(d) / name)
        dead = subprocess.Popen(["true"])
        dead.wait()
        yield [
            "/proc/self/ns/net",
            "/proc/1/ns/net",
            f"/proc/{os.getpid()}/ns/net",
            "/proc/self/ns/uts",
            "/etc/passwd",
            "/tmp",
            "/",
            "",
            ".",
            "..",
            str(fifo),
            *(str(Path(d) / n) for n in links),
            f"pid:{dead.pid}",
            f"pid:{os.getpid()}",
            "pid:1",
            "pid:0",
            "pid:-1",
            "pid:abc",
            "pid:99999999",
            "pid:",
            "/dev/null",
            "/run/netns",
            "/run/netns/../netns",
            "/proc/self/fd/0",
            "net:[4026531840]",
        ]


@pytest.fixture(scope="module", params=["root", "polkit"])
async def target(
    request: pytest.FixtureRequest, bus_address: str, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[Target]:
    with (
        temp_netns("fz") as netns,
        special_paths() as specials,
        caller_bus(request.param, bus_address) as (bus, uid, named),
    ):
        async with reliability_rig(bus, tmp_path_factory.mktemp("fuzz"), 2) as rig:
            yield Target(rig, netns, settings_of(rig.nics), specials, uid, named)


def unchanged(t: Target) -> None:
    assert t.rig.daemon.proc is not None and t.rig.daemon.proc.returncode is None, "daemon died"
    for device, want in t.settings.items():
        assert host_settings(want.name) == want, f"{device} moved or changed"


texts = st.one_of(
    st.text(alphabet=st.characters(exclude_characters="\x00"), max_size=40),
    st.sampled_from(["a\x00b", "\ud800", "x\udfff"]),  # NUL, lone surrogates
    st.text(alphabet=st.characters(codec="utf-8"), min_size=1, max_size=8).map(
        lambda s: s * 8192  # 8-64 KiB
    ),
    st.sampled_from(["sim0", "sim1", "shared", "exclusive", "unavailable", "0" * 16]),
)
variants = st.one_of(
    st.builds(lambda v: Variant("s", v), texts),
    st.builds(lambda v: Variant("u", v), st.integers(0, 2**32 - 1)),
    st.builds(lambda v: Variant("i", v), st.integers(-(2**31), 2**31 - 1)),
    st.builds(lambda v: Variant("b", v), st.booleans()),
    st.builds(lambda v: Variant("as", v), st.lists(texts, max_size=4)),
    st.builds(lambda v: Variant("ay", v), st.binary(max_size=16)),
    st.builds(lambda v: Variant("a{sv}", {"k": Variant("s", v)}), texts),
)
option_keys = st.one_of(
    st.sampled_from(["ifname", "mtu", "addresses", "shared", "chardevs", "owner", "netdev"]),
    st.text(max_size=20),
)
options = st.dictionaries(option_keys, variants, max_size=4)


def run_property(test: Callable[[Fuzzer], None], address: str, uid: int) -> dict[str, int]:
    fuzzer = Fuzzer(address, uid)
    try:
        test(fuzzer)
    finally:
        fuzzer.close()
    return fuzzer.outcomes


async def fuzz(t: Target, name: str, body: Callable[[Fuzzer, Target], None]) -> None:
    def test(f: Fuzzer) -> None:
        body(f, t)

    outcomes = await asyncio.to_thread(run_property, test, t.rig.daemon.bus_address, t.uid)
    print(f"fuzz {name}: {sum(outcomes.values())} calls, outcomes {outcomes}")
    await assert_invariants(t.rig.client, t.rig.nics, t.settings, [t.netns])


def expect_named(result: str, t: Target) -> None:
    assert result in t.named, f"unnamed or unexpected outcome {result}"


async def test_each_run_calls_as_its_caller(target: Target) -> None:
    """As nobody, SetNetnsMode (a no-op: the mode is shared already) passes because
    polkitd's rule allows it: polkit is in that run's path."""

    def body(f: Fuzzer, t: Target) -> None:
        assert f.uid_on_the_bus() == t.uid
        assert f.call("SetNetnsMode", "s", ["shared"]) == "ok"

    await fuzz(target, "caller", body)


async def test_claim_with_random_device_netns_and_options_is_refused_by_name(
    target: Target,
) -> None:
    def body(f: Fuzzer, t: Target) -> None:
        @FUZZ
        @given(
            st.one_of(texts, st.just("sim0")),
            st.one_of(texts, st.sampled_from(t.specials)),
            options,
        )
        def prop(device: str, netns: str, opts: dict[str, Variant]) -> None:
            expect_named(f.call("Claim", "ssa{sv}", [device, netns, opts]), t)
            unchanged(t)

        prop()

    await fuzz(target, "Claim(random)", body)


async def test_claim_of_a_real_netns_with_a_bad_option_is_invalid_args(target: Target) -> None:
    bad = st.one_of(
        st.tuples(
            st.text(min_size=1, max_size=20).filter(
                lambda k: (
                    k not in ("ifname", "mtu", "addresses", "shared", "chardevs", "owner", "netdev")
                )
            ),
            variants,
        ),
        st.tuples(
            st.sampled_from(["ifname", "owner"]), variants.filter(lambda v: v.signature != "s")
        ),
        st.tuples(st.just("mtu"), variants.filter(lambda v: v.signature != "u")),
        st.tuples(
            st.just("mtu"),
            st.builds(
                lambda v: Variant("u", v),
                st.one_of(st.integers(0, 67), st.integers(65536, 2**32 - 1)),
            ),
        ),
        st.tuples(
            st.sampled_from(["shared", "netdev"]), variants.filter(lambda v: v.signature != "b")
        ),
        st.tuples(
            st.sampled_from(["addresses", "chardevs"]),
            variants.filter(lambda v: v.signature != "as"),
        ),
        st.tuples(
            st.just("ifname"),
            st.builds(
                lambda v: Variant("s", v),
                st.one_of(
                    st.text(min_size=16),
                    st.just(""),
                    st.just("a/b"),
                    st.just("a b"),
                    st.just("."),
                    st.just("x\x00y"),
                ),
            ),
        ),
        st.tuples(
            st.just("addresses"),
            st.builds(
                lambda v: Variant("as", [v]),
                st.one_of(st.text(max_size=30), st.just("10.0.0.1"), st.just("10.0.0.1/33")),
            ),
        ),
        st.tuples(
            st.just("chardevs"),
            st.builds(
                lambda v: Variant("as", [v]),
                st.text(max_size=10).filter(
                    lambda k: k not in ("uverbs", "rdma_cm", "umad", "issm")
                ),
            ),
        ),
        st.tuples(
            st.just("owner"),
            st.builds(
                lambda v: Variant("s", v),
                st.one_of(
                    st.text(min_size=257, max_size=300).filter(lambda s: len(s.encode()) > 256),
                    st.just("a\x00b"),
                ),
            ),
        ),
    )

    def body(f: Fuzzer, t: Target) -> None:
        @FUZZ
        @given(options, bad, st.sampled_from(["Claim", "ClaimFd"]))
        def prop(opts: dict[str, Variant], wrong: tuple[str, Variant], member: str) -> None:
            opts = {k: v for k, v in opts.items() if k != wrong[0]} | {wrong[0]: wrong[1]}
            if member == "Claim":
                result = f.call("Claim", "ssa{sv}", ["sim0", t.netns, opts])
            else:
                fd = os.open(f"/run/netns/{t.netns}", os.O_RDONLY)
                try:
                    result = f.call("ClaimFd", "sha{sv}", ["sim0", 0, opts], [fd])
                finally:
                    os.close(fd)
            assert result in ("org.freedesktop.DBus.Error.InvalidArgs", NOT_SENDABLE), (
                opts,
                result,
            )
            unchanged(t)

        prop()

    await fuzz(target, "Claim(real netns, one bad option)", body)


@contextlib.contextmanager
def odd_fd(kind: str) -> Iterator[int]:
    """An open fd that is not a usable netns."""
    if kind == "pipe":
        r, w = os.pipe()
        try:
            yield r
        finally:
            os.close(r)
            os.close(w)
        return
    if kind == "socket":
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
            yield s.fileno()
        return
    paths = {
        "file": "/etc/passwd",
        "dir": "/tmp",
        "devnull": "/dev/null",
        "init-netns": "/proc/self/ns/net",
        "uts-ns": "/proc/self/ns/uts",
        "netns-dir": "/run/netns",
    }
    fd = os.open(paths[kind], os.O_RDONLY)
    try:
        yield fd
    finally:
        os.close(fd)


async def test_claim_fd_with_fds_that_are_not_a_netns_is_refused_by_name(target: Target) -> None:
    kinds = ["pipe", "socket", "file", "dir", "devnull", "init-netns", "uts-ns", "netns-dir"]

    def body(f: Fuzzer, t: Target) -> None:
        @FUZZ
        @given(st.sampled_from(kinds), st.one_of(st.just("sim0"), texts), options)
        def prop(kind: str, device: str, opts: dict[str, Variant]) -> None:
            with odd_fd(kind) as fd:
                expect_named(f.call("ClaimFd", "sha{sv}", [device, 0, opts], [fd]), t)
            unchanged(t)

        prop()

    await fuzz(target, "ClaimFd(non-netns fds)", body)


async def test_every_other_method_with_random_arguments_answers_by_name(target: Target) -> None:
    readers = {"ListDevices", "ListClaims"}

    def body(f: Fuzzer, t: Target) -> None:
        @FUZZ
        @given(st.sampled_from(["GetDevice", "Release", "SetNetnsMode"]), texts)
        def one_string(member: str, arg: str) -> None:
            result = f.call(member, "s", [arg])
            if member == "GetDevice" and arg in t.settings:
                assert result == "ok"
            elif member == "SetNetnsMode" and arg == "shared":
                assert result == "ok"  # already shared: a no-op
            else:
                expect_named(result, t)
            unchanged(t)

        @FUZZ
        @given(
            st.sampled_from(
                [
                    "Claim",
                    "ClaimFd",
                    "Release",
                    "SetNetnsMode",
                    "GetDevice",
                    "ListDevices",
                    "ListClaims",
                    "NoSuchMethod",
                ]
            ),
            st.sampled_from(["", "s", "i", "ss", "sss", "ssa{ss}", "sia{sv}", "as", "ay"]),
            st.data(),
        )
        def wrong_signature(member: str, sig: str, data: st.DataObject) -> None:
            values = {
                "s": texts,
                "i": st.integers(-5, 5),
                "as": st.lists(texts, max_size=2),
                "ay": st.binary(max_size=8),
                "a{ss}": st.dictionaries(texts, texts, max_size=2),
                "a{sv}": options,
            }
            parts = {
                "": [],
                "s": ["s"],
                "i": ["i"],
                "ss": ["s", "s"],
                "sss": ["s", "s", "s"],
                "ssa{ss}": ["s", "s", "a{ss}"],
                "sia{sv}": ["s", "i", "a{sv}"],
                "as": ["as"],
                "ay": ["ay"],
            }[sig]
            body_ = [data.draw(values[p]) for p in parts]
            result = f.call(member, sig, body_)
            if result == "ok":
                assert member in readers | {"GetDevice", "SetNetnsMode"}, (member, sig, body_)
            else:
                expect_named(result, t)
            unchanged(t)

        one_string()
        wrong_signature()

    await fuzz(target, "other methods / wrong signatures", body)


async def test_claim_object_release_on_unknown_paths_is_named(target: Target) -> None:
    def body(f: Fuzzer, t: Target) -> None:
        @FUZZ
        @given(st.text(alphabet="abcdef0123456789_", min_size=1, max_size=40))
        def prop(tail: str) -> None:
            result = f.call(
                "Release", "", [], path=f"/io/rdmad1/claim/{tail}", iface="io.rdmad1.Claim"
            )
            assert result in t.named | {"org.freedesktop.DBus.Error.UnknownObject"}, result
            unchanged(t)

        prop()

    await fuzz(target, "Claim.Release(unknown objects)", body)
