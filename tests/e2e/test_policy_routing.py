"""Policy routing per claim, end to end: the real rdmad (simulated RDMA bound to four real
veths), a private bus, a pod netns with four rails, and the veths' peers in a `far` netns
of their own. With a table per claim, `ip route get PEER from ADDR_i` in the pod leaves
through rail i, whether the rails share one subnet or each has its own with a gateway; and
release or the pod's end leaves no rule, table or rail setting behind."""

from __future__ import annotations

import contextlib
import functools
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from dbus_fast import Variant

from testbed.daemon import BUS_NAME, Client, DBusCallError, RdmadProcess
from testbed.net import VethPair, ip, temp_netns, temp_veth
from tests.e2e.test_rdmactl import rdmactl
from tests.support.sim_rig import Rig

CLAIM_IFACE = "io.rdmad1.Claim"
RAILS = 4
SYSCTLS = ("arp_ignore", "arp_announce", "rp_filter")


@contextlib.asynccontextmanager
async def four_rails(bus_address: str, workdir: Path) -> AsyncIterator[Rig]:
    """sim0..sim3 on four new veths."""
    with contextlib.ExitStack() as stack:
        pairs = [stack.enter_context(temp_veth("pr")) for _ in range(RAILS)]
        nics = {f"sim{i}": pair for i, pair in enumerate(pairs)}
        spec = ",".join(f"{dev}={pair.host}" for dev, pair in nics.items())
        daemon = RdmadProcess(bus_address, workdir, spec, "shared", [])
        await daemon.start()
        client = await Client.connect(bus_address)
        try:
            yield Rig(daemon, client, nics)
        finally:
            client.close()
            await daemon.kill()


@pytest.fixture
async def rig(bus_address: str, tmp_path: Path) -> AsyncIterator[Rig]:
    async with four_rails(bus_address, tmp_path) as r:
        yield r


@pytest.fixture
def far() -> Iterator[str]:
    """The peers' netns."""
    with temp_netns("far") as name:
        yield name


def peer_up(pair: VethPair, far: str, *addresses: str) -> None:
    """The veth's peer end in `far` with `addresses`; its host end up (a macvlan's parent)."""
    ip("link", "set", pair.peer, "netns", far)
    for a in addresses:
        ip("addr", "add", a, "dev", pair.peer, *(["nodad"] if ":" in a else []), netns=far)
    ip("link", "set", pair.peer, "up", netns=far)
    ip("link", "set", pair.host, "up")


async def claim(rig: Rig, device: str, netns: str, **options: Variant) -> str:
    path: str = await rig.client.manager("Claim", "ssa{sv}", device, netns, options)
    return path


async def release(rig: Rig, path: str) -> None:
    await rig.client.call_raw(BUS_NAME, path, CLAIM_IFACE, "Release")


async def rdmactl_json(rig: Rig, *args: str) -> Any:
    return (await rdmactl(rig, "--json", *args)).json()


def released(claim_id: str, body: list[Any]) -> bool:
    return bool(body[0] == claim_id)


def leaves_through(pod: str, peer: str, source: str) -> str:
    """The interface `ip route get PEER from SOURCE` picks in the pod."""
    words = ip("-6" if ":" in peer else "-4", "route", "get", peer, "from", source, netns=pod)
    return words.split(" dev ")[1].split()[0]


def sysctls(ifname: str, netns: str | None = None) -> tuple[int, ...]:
    """arp_ignore, arp_announce and rp_filter of `ifname` (read inside `netns`: /proc/sys/net
    shows the reader's netns)."""
    paths = [f"/proc/sys/net/ipv4/conf/{ifname}/{name}" for name in SYSCTLS]
    if netns is None:
        return tuple(int(Path(p).read_text()) for p in paths)
    return tuple(int(v) for v in ip("netns", "exec", netns, "cat", *paths).split())


def policy_left(pod: str) -> tuple[str, str]:
    """The pod's rules and routes outside main, local and default."""
    rules = ip("rule", "show", netns=pod) + ip("-6", "rule", "show", netns=pod)
    mine = [r for r in rules.splitlines() if "lookup 1" in r and "lookup main" not in r]
    tables = ip("route", "show", "table", "all", netns=pod) + ip(
        "-6", "route", "show", "table", "all", netns=pod
    )
    routed = [r for r in tables.splitlines() if " table 1" in r]
    return "\n".join(mine), "\n".join(routed)


async def test_rails_on_one_subnet_each_answer_for_their_own_address(rig: Rig, far: str) -> None:
    with temp_netns("pod") as pod:
        paths = []
        for i in range(RAILS):
            peer_up(rig.nics[f"sim{i}"], far, f"10.70.0.{200 + i}/24")
            paths.append(
                await claim(
                    rig,
                    f"sim{i}",
                    pod,
                    shared=Variant("b", True),
                    ifname=Variant("s", f"rail{i}"),
                    addresses=Variant("as", [f"10.70.0.{10 + i}/24"]),
                    table=Variant("u", 0),
                )
            )
        tables = [await rig.client.prop(p, CLAIM_IFACE, "RouteTable") for p in paths]
        assert tables == [1000, 1001, 1002, 1003]
        for i in range(RAILS):
            assert leaves_through(pod, "10.70.0.200", f"10.70.0.{10 + i}") == f"rail{i}"
            assert sysctls(f"rail{i}", pod) == (1, 2, 2)
        for p in paths:
            await release(rig, p)
        assert policy_left(pod) == ("", "")


async def test_rails_on_a_subnet_each_with_a_gateway_route_through_their_own_ipv4_and_ipv6(
    rig: Rig, far: str
) -> None:
    """Whole-device claims: the rails are the veths' own ends, moved into the pod."""
    with temp_netns("pod") as pod:
        ip("netns", "exec", pod, "sysctl", "-qw", "net.ipv6.conf.default.accept_dad=0")
        paths = []
        for i in range(RAILS):
            peer_up(rig.nics[f"sim{i}"], far, f"10.8{i}.0.254/24", f"fd00:{i}::fe/64")
            paths.append(
                await claim(
                    rig,
                    f"sim{i}",
                    pod,
                    ifname=Variant("s", f"rail{i}"),
                    addresses=Variant("as", [f"10.8{i}.0.1/24", f"fd00:{i}::1/64"]),
                    table=Variant("u", 0),
                    routes=Variant(
                        "as", [f"0.0.0.0/0,via=10.8{i}.0.254", f"::/0,via=fd00:{i}::fe"]
                    ),
                )
            )
        for i in range(RAILS):
            assert leaves_through(pod, "10.99.0.5", f"10.8{i}.0.1") == f"rail{i}"
            assert leaves_through(pod, "fd99::5", f"fd00:{i}::1") == f"rail{i}"
        for p in paths:
            await release(rig, p)
        assert policy_left(pod) == ("", "")
        for i in range(RAILS):  # home, with init_net's defaults
            assert sysctls(rig.nics[f"sim{i}"].host) == (0, 0, _default_rp_filter())


def _default_rp_filter() -> int:
    return int(Path("/proc/sys/net/ipv4/conf/default/rp_filter").read_text())


async def test_a_pod_that_ends_takes_its_rules_with_it_and_leaves_rdmad_nothing_to_undo(
    rig: Rig, far: str
) -> None:
    with temp_netns("pod") as pod:
        since = rig.client.mark()
        paths = [
            await claim(
                rig,
                f"sim{i}",
                pod,
                shared=Variant("b", i % 2 == 1),
                ifname=Variant("s", f"rail{i}"),
                addresses=Variant("as", [f"10.70.0.{10 + i}/24"]),
                table=Variant("u", 0),
            )
            for i in range(2)
        ]
        ids = [await rig.client.prop(p, CLAIM_IFACE, "Id") for p in paths]
    for cid in ids:
        await rig.client.wait_signal("Released", functools.partial(released, cid), since=since)
    assert await rig.client.manager("ListClaims") == []
    # sim0's rail (its veth end) died with the pod, sim1's macvlan too; the rail settings
    # were never the host's: sim1's parent is as it was.
    assert sysctls(rig.nics["sim1"].host) == (0, 0, _default_rp_filter())
    assert "routing table" not in rig.daemon.log()


async def test_a_table_taken_in_the_netns_is_refused_and_nothing_is_installed(
    rig: Rig,
) -> None:
    with temp_netns("pod") as pod:
        ip("rule", "add", "from", "192.0.2.9", "lookup", "1500", netns=pod)
        with pytest.raises(DBusCallError) as err:
            await claim(
                rig,
                "sim0",
                pod,
                shared=Variant("b", True),
                addresses=Variant("as", ["10.70.0.10/24"]),
                table=Variant("u", 1500),
            )
        assert err.value.name == "org.freedesktop.DBus.Error.InvalidArgs"
        assert "routing table 1500" in str(err.value)
        rules, routes = policy_left(pod)
        assert rules.split(":")[1].split() == ["from", "192.0.2.9", "lookup", "1500"]
        assert routes == ""
        assert ip("-o", "link", "show", "net1", netns=pod, check=False) == ""


async def test_a_gateway_off_the_claims_subnets_is_refused_before_the_kernel(rig: Rig) -> None:
    with temp_netns("pod") as pod:
        with pytest.raises(DBusCallError) as err:
            await claim(
                rig,
                "sim0",
                pod,
                shared=Variant("b", True),
                addresses=Variant("as", ["10.70.0.10/24"]),
                table=Variant("u", 0),
                routes=Variant("as", ["0.0.0.0/0,via=10.71.0.1"]),
            )
        assert err.value.name == "org.freedesktop.DBus.Error.InvalidArgs"
        assert "on-link of none" in str(err.value)
        assert await rig.client.manager("ListClaims") == []


async def test_rdmactl_claims_with_a_table_and_routes_and_shows_it(rig: Rig, far: str) -> None:
    peer_up(rig.nics["sim0"], far, "10.70.0.200/24")
    with temp_netns("pod") as pod:
        made = await rdmactl_json(
            rig,
            "claim",
            "sim0",
            pod,
            "--shared",
            "--address",
            "10.70.0.10/24",
            "--table",
            "auto",
            "--route",
            "10.99.0.0/16,via=10.70.0.200",
        )
        assert made["route_table"] == 1000
        (listed,) = await rdmactl_json(rig, "claims")
        assert listed["route_table"] == 1000
        assert leaves_through(pod, "10.99.0.5", "10.70.0.10") == "net1"
        await rdmactl_json(rig, "release", made["id"])
        assert policy_left(pod) == ("", "")
