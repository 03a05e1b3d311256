"""The invariant every reliability test ends with: no device is stranded, none is forgotten.

It compares the daemon's view (ListDevices, ListClaims over the bus, or a Core in-process)
with the kernel's, read independently with iproute2:

- a device with no whole-device claim has its netdev in init_net, under its host name
  (and, if the test recorded them, with its host MTU, admin state and addresses);
- a device with a whole-device claim has its netdev in the claim's netns, under the
  claim's interface name, and nowhere else; its netns is alive and has an nsid in init_net;
- a shared claim has its macvlan in its netns; no macvlan in a watched netns lacks a claim;
- device states agree with the claims (claimed: one whole claim; shared: only shared
  claims; available: none), so two whole claims or a whole + shared claim are caught;
- the netdev the daemon reports for a device is the one the kernel has in init_net.

A veth destroyed with its netns (both ends gone) is "destroyed", not stranded: that is what
the kernel does to virtual netdevs, and the daemon cannot prevent it.

Use `await assert_invariants(client, nics)`; it prints one summary line (the figures the
reliability tests report) and raises AssertionError listing every violation.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from testbed.daemon import Client
from testbed.net import VethPair, addresses, ip_json, is_up

SETTLE_S = 2.0


@dataclass(frozen=True)
class HostSettings:
    """What a free device's netdev must look like (recorded before the test touches it)."""

    name: str
    ifindex: int
    mtu: int
    up: bool
    addresses: frozenset[str]


def host_settings(name: str) -> HostSettings:
    (info,) = ip_json("link", "show", "dev", name)
    return HostSettings(
        name, int(info["ifindex"]), int(info["mtu"]), is_up(info), frozenset(addresses(name))
    )


@dataclass(frozen=True)
class DaemonView:
    devices: dict[str, tuple[str, str]]  # device -> (state, netdev)
    claims: list[tuple[str, str, str, str]]  # (id, device, "net:[INODE]", ifname)


async def daemon_view(client: Client) -> DaemonView:
    devices = await client.manager("ListDevices")
    claims = await client.manager("ListClaims")
    return DaemonView(
        {str(n): (str(s), str(nd)) for n, s, nd, _ in devices},
        [(str(c[0]), str(c[1]), str(c[2]), str(c[3])) for c in claims],
    )


@dataclass
class Report:
    free: int = 0
    claimed: int = 0
    shared_claims: int = 0
    destroyed: int = 0
    problems: list[str] = field(default_factory=list)

    @property
    def stranded(self) -> int:
        return sum(1 for p in self.problems if p.startswith("STRANDED"))

    def summary(self) -> str:
        return (
            f"invariants: free={self.free} claimed={self.claimed} "
            f"shared_claims={self.shared_claims} destroyed={self.destroyed} "
            f"stranded={self.stranded} violations={len(self.problems)}"
        )


def _links(netns: str | None) -> list[dict[str, Any]]:
    try:
        return ip_json("-d", "link", "show", netns=netns)
    except RuntimeError:
        return []  # the netns vanished while we looked


def _named_netns() -> dict[int, str]:
    out: dict[int, str] = {}
    for name in os.listdir("/run/netns") if os.path.isdir("/run/netns") else []:
        try:
            out[os.stat(f"/run/netns/{name}").st_ino] = name
        except OSError:
            continue
    return out


def _nsid_names() -> set[str]:
    """Named netns that init_net has an nsid for (`ip netns list-id`)."""
    res = subprocess.run(["ip", "-j", "netns", "list-id"], capture_output=True, text=True)
    if res.returncode != 0 or not res.stdout.strip():
        return set()
    return {str(e["name"]) for e in json.loads(res.stdout) if "name" in e}


def compare(
    view: DaemonView,
    nics: Mapping[str, VethPair],
    settings: Mapping[str, HostSettings] | None = None,
    watched_netns: Iterable[str] = (),
) -> Report:
    """Check the invariant for the devices in `nics` (device -> its veth); pure reads."""
    report = Report()
    init = {int(x["ifindex"]): x for x in _links(None)}
    init_names = {str(x["ifname"]) for x in init.values()}
    by_inode = _named_netns()
    with_nsid = _nsid_names()
    ns_links: dict[str, list[dict[str, Any]]] = {}

    def links_in(name: str) -> list[dict[str, Any]]:
        if name not in ns_links:
            ns_links[name] = _links(name)
        return ns_links[name]

    whole: dict[str, list[tuple[str, str, str, str]]] = {}
    shared: dict[str, list[tuple[str, str, str, str]]] = {}
    for claim in view.claims:
        cid, device, netns, ifname = claim
        state = view.devices.get(device, ("?", ""))[0]
        (shared if state == "shared" else whole).setdefault(device, []).append(claim)
        inode = int(netns.removeprefix("net:[").removesuffix("]") or 0)
        ns_name = by_inode.get(inode)
        if ns_name is None:
            report.problems.append(f"claim {cid} ({device}) names a netns that is gone: {netns}")
            continue
        if ns_name not in with_nsid:
            report.problems.append(f"claim {cid}: init_net has no nsid for {ns_name}")
        inside = {str(x["ifname"]): x for x in links_in(ns_name)}
        if ifname not in inside:
            report.problems.append(f"claim {cid} ({device}): no {ifname} in {ns_name}")
        elif state == "shared":
            kind = inside[ifname].get("linkinfo", {}).get("info_kind")
            if kind != "macvlan":
                report.problems.append(f"claim {cid}: {ifname} in {ns_name} is {kind}, not macvlan")
        report.shared_claims += state == "shared"

    for device, pair in nics.items():
        state, netdev = view.devices.get(device, ("missing", ""))
        mine = whole.get(device, [])
        if len(mine) > 1 or (mine and device in shared):
            report.problems.append(f"DOUBLE CLAIM of {device}: {mine + shared.get(device, [])}")
        want = settings.get(device) if settings else None
        host = next((x for x in init.values() if x["ifname"] == pair.host), None)
        if want is not None and host is None and want.ifindex in init:
            host = init[want.ifindex]  # home, but under another name: reported below
        if mine:
            report.claimed += 1
            if host is not None:
                report.problems.append(
                    f"{device} is claimed ({mine[0][0]}) but its netdev is in init_net"
                )
            if state != "claimed":
                report.problems.append(f"{device}: one whole claim but state {state!r}")
            continue
        if host is None:
            if pair.peer not in init_names:
                report.destroyed += 1  # the veth died with a netns, both ends gone
                continue
            where = [
                n
                for n in set(by_inode.values()) | set(watched_netns)
                if any(x["ifname"] == pair.host for x in links_in(n))
            ]
            report.problems.append(
                f"STRANDED {device}: netdev {pair.host} is not in init_net "
                f"(found in {where or 'no named netns'}) and no claim holds it"
            )
            continue
        report.free += 1
        if host["ifname"] != pair.host:
            report.problems.append(f"STRANDED {device}: home as {host['ifname']}, not {pair.host}")
        if want is not None:
            got = (int(host["mtu"]), is_up(host), frozenset(addresses(str(host["ifname"]))))
            if got != (want.mtu, want.up, want.addresses):
                report.problems.append(
                    f"{device}: home with mtu/up/addresses {got}, host settings were "
                    f"{(want.mtu, want.up, want.addresses)}"
                )
        expected_state = "shared" if device in shared else "available"
        if state != expected_state:
            report.problems.append(f"{device}: state {state!r}, expected {expected_state!r}")
        if netdev != host["ifname"]:
            report.problems.append(
                f"{device}: daemon says netdev {netdev!r}, kernel {host['ifname']}"
            )

    claimed_macvlans = {
        (by_inode.get(int(c[2][5:-1])), c[3]) for c in view.claims if c[1] in shared
    }
    for ns_name in watched_netns:
        for x in links_in(ns_name):
            if x.get("linkinfo", {}).get("info_kind") != "macvlan":
                continue
            if (ns_name, x["ifname"]) not in claimed_macvlans:
                report.problems.append(f"STRANDED macvlan {x['ifname']} in {ns_name}: no claim")
    return report


async def assert_invariants(
    client: Client,
    nics: Mapping[str, VethPair],
    settings: Mapping[str, HostSettings] | None = None,
    watched_netns: Iterable[str] = (),
    settle: float = SETTLE_S,
) -> Report:
    """Fetch the daemon's view, compare it with the kernel, print the figures, fail on any
    violation that is still there after `settle` seconds.

    The daemon learns about netdevs from kernel events, so right after a call its device
    view may lag the kernel by an event or two; a violation must persist to count."""
    watched = list(watched_netns)
    deadline = time.monotonic() + settle
    while True:
        report = compare(await daemon_view(client), nics, settings, watched)
        if not report.problems or time.monotonic() > deadline:
            break
        await asyncio.sleep(0.05)
    print(report.summary())
    assert not report.problems, "invariant violated:\n  " + "\n  ".join(report.problems)
    return report
