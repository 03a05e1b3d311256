"""What must hold whenever the soak is quiescent (no action in flight, no fault window
open, every rdmad back up), per node. The device invariant is tests/support/invariants.py's
`compare`; this adds what a soak can break besides:

- a netdev=false claim (InterfaceName "") moved only the RDMA device: its netdev must be
  home like a free one's, and its netns alive;
- compare() finds netns by name: a claim whose netns lost its name but is still held by a
  process is right (the netns exists), and a netdev in no live netns is in a dying one (the
  kernel destroys it with its veth when its cleanup runs);
- no orphan macvlan: none in a slot's netns without its claim (compare), and none in
  init_net on a node's veth (a shared claim interrupted before its macvlan moved);
- a held claim (Hold, netns "") moved nothing: its device is taken (state claimed, or
  shared) and its netdev home;
- no orphan policy rule or route table: each slot's netns has the kernel's default rules
  (IPv4 and IPv6) and otherwise only rules that look up the table of a listed claim in it;
  its routes, in every table, are on lo or on the interface of a listed claim there, and a
  table other than main and local is a listed claim's there; init_net has the rules it had
  when the soak began and no route in a table of rdmad's range;
- each listed claim has its CDI spec, and each claim spec its listed claim (a claim spec's
  first device name is its claim id); a pod's spec (a pod CDI name: its one device is the
  name) is named by a listed claim's PodCdiName and injects only device nodes of live
  claims; the specs of one netns's claims and their pod specs agree on every env key;
- the exporter read rdmad (rdmad_up 1) and its rdmad_claim_info series are the listed claims;
- rdmad logged no traceback (every fault the soak makes has a one-line log by design);
- no claim lost: every claim acknowledged to a caller (a Claim reply) or seen in a Claimed
  signal is still listed, or `rdmactl monitor` printed its Released with a reason. When the
  monitor was not listening at some time since the claim was acknowledged (the bus or the
  monitor restarting), a claim that is not listed is accounted for by absence: no CDI spec,
  no exporter series and (by the device invariant) no device or macvlan held for it.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from testbed.daemon import BUS_NAME, MANAGER_PATH, Client, DBusCallError
from testbed.net import ip_json
from tests.soak.node import BUS_LOST, Node, Slot
from tests.support.invariants import DaemonView, compare, daemon_view

CLAIM_IFACE, PROPERTIES = "io.rdmad1.Claim", "org.freedesktop.DBus.Properties"
SETTLE_S = 30.0  # rdmad ends claims of a netns deleted just before, from kernel events
DEFAULT_RULES = {4: {0, 32766, 32767}, 6: {0, 32766}}
RDMAD_TABLES = range(1000, 2000)  # rdmad's route_tables by default: what table=0 picks
MAIN_TABLES = {None, "main", "local", "default", 254, 255, 253}


def rules(family: int, netns: str | None = None) -> list[tuple[Any, ...]]:
    return sorted(
        (r.get("priority"), r.get("table"), r.get("src"), r.get("dst"))
        for r in ip_json(f"-{family}", "rule", "show", netns=netns)
    )


@dataclass
class Verdict:
    problems: list[str] = field(default_factory=list)
    figures: Counter[str] = field(default_factory=Counter)


def _slot_names(slots: list[Slot]) -> list[str]:
    return [s.name for s in slots if s.alive()]


def _netns_names() -> dict[int, str]:
    out = {}
    for name in os.listdir("/run/netns"):
        try:
            out[os.stat(f"/run/netns/{name}").st_ino] = name
        except OSError:
            continue
    return out


def _inode(netns: str) -> int:
    return int(netns.removeprefix("net:[").removesuffix("]") or 0)


def holders(inode: int) -> list[str]:
    """The processes that keep netns `inode` alive, by their netns or an open fd."""
    out = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            refs = [os.readlink(f"/proc/{pid}/ns/net")]
            refs += [os.readlink(f"/proc/{pid}/fd/{fd}") for fd in os.listdir(f"/proc/{pid}/fd")]
            if f"net:[{inode}]" in refs:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    cmdline = f.read().replace(b"\0", b" ").decode(errors="replace")
                out.append(f"{pid} {cmdline[:80]}")
        except OSError:
            continue
    return out


def live_netns_with(ifname: str) -> list[str]:
    """The live netns (each entered through a process in it) that have a link `ifname`."""
    seen: dict[str, str] = {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            seen.setdefault(os.readlink(f"/proc/{pid}/ns/net"), pid)
        except OSError:
            continue
    found = []
    for label, pid in seen.items():
        done = subprocess.run(
            ["nsenter", f"--net=/proc/{pid}/ns/net", "ip", "link", "show", "dev", ifname],
            capture_output=True,
        )
        if done.returncode == 0:
            found.append(f"{label} (pid {pid})")
    return found


def judge_stranded(problems: list[str], verdict: Verdict) -> list[str]:
    """A netdev in no named netns and no live one is in a dying netns (the kernel's cleanup
    of a deleted netns runs later, slower under load): it is destroyed there with its veth,
    not stranded. One found in a live unnamed netns is stranded: say where."""
    out = []
    for problem in problems:
        if not problem.startswith("STRANDED") or "found in no named netns" not in problem:
            out.append(problem)
            continue
        ifname = problem.split("netdev ", 1)[1].split(" ", 1)[0]
        where = live_netns_with(ifname)
        if where:
            out.append(f"{problem}; it is in {where}")
        else:
            verdict.figures["netdevs_in_dying_netns"] += 1
    return out


def judge_unnamed(view: DaemonView, problems: list[str], verdict: Verdict) -> list[str]:
    """compare() finds netns by their names; a claim whose netns lost its name but is kept
    alive by a process is held right (the netns exists): drop that problem. For a dead one,
    say so."""
    named = _netns_names()
    kept = []
    for cid, _device, netns, _ifname in view.claims:
        if not netns or _inode(netns) in named:  # "": held, in no netns yet
            continue
        alive = holders(_inode(netns))
        if alive:
            verdict.figures["claims_in_unnamed_live_netns"] += 1
            print(f"note: claim {cid}'s netns {netns} has no name but lives on in {alive}")
            problems = [p for p in problems if not p.startswith(f"claim {cid} ")]
        else:
            kept.append(f"claim {cid}: no process holds {netns}: it is dead, the claim lives on")
    return problems + kept


def without_unmoved(view: DaemonView, verdict: Verdict) -> DaemonView:
    """The view compare() understands: netdev=false and held claims left out, their devices
    shown as free (their netdevs never left init_net), but for a held share of a device that
    others share; their netns and device states checked here."""
    by_inode = _netns_names()
    devices = dict(view.devices)
    claims = []
    for claim in view.claims:
        cid, device, netns, ifname = claim
        if not netns:
            verdict.figures["held_claims"] += 1
            state, netdev = view.devices.get(device, ("?", ""))  # as rdmad says, not as set below
            if state not in ("claimed", "shared"):
                verdict.problems.append(f"held claim {cid}: {device} is {state!r}")
            if state == "claimed" or not any(c[1] == device and c[2] for c in view.claims):
                devices[device] = ("available", netdev)
            continue
        if ifname:
            claims.append(claim)
            continue
        verdict.figures["nodev_claims"] += 1
        if _inode(netns) not in by_inode:
            verdict.problems.append(f"netdev=false claim {cid} ({device}): netns {netns} is gone")
        state, netdev = devices.get(device, ("?", ""))
        if state != "claimed":
            verdict.problems.append(f"netdev=false claim {cid}: {device} is {state!r}")
        devices[device] = ("available", netdev)
    return DaemonView(devices, claims)


def check_routing(
    views: list[DaemonView], props: dict[str, dict[str, Any]], slots: list[Slot], init_rules: Any
) -> Verdict:
    """Over every node's claims: a slot's netns holds the claims of both nodes. `props`: each
    listed claim's Claim properties, by id."""
    verdict = Verdict()
    by_inode = _netns_names()
    claimed: dict[str, set[str]] = {}
    tables: dict[str, set[int]] = {}
    for view in views:
        for cid, _device, netns, ifname in view.claims:
            name = by_inode.get(_inode(netns), "?")
            claimed.setdefault(name, set()).add(ifname)
            table = int(props.get(cid, {}).get("RouteTable", 0))
            if table:
                tables.setdefault(name, set()).add(table)
                verdict.figures["claims_with_table"] += 1
    for name in _slot_names(slots):
        mine = tables.get(name, set())
        try:
            for family in (4, 6):
                for prio, table, src, _dst in rules(family, name):
                    if prio not in DEFAULT_RULES[family] and _table(table) not in mine:
                        verdict.problems.append(
                            f"orphan policy rule in {name} (IPv{family}): "
                            f"{prio} from {src} lookup {table}; claims' tables {sorted(mine)}"
                        )
                prios = {r[0] for r in rules(family, name)}
                if not DEFAULT_RULES[family] <= prios:
                    verdict.problems.append(f"default rules gone in {name} (IPv{family}): {prios}")
                for route in ip_json(f"-{family}", "route", "show", "table", "all", netns=name):
                    dev, in_table = route.get("dev"), route.get("table")
                    if dev != "lo" and dev not in claimed.get(name, set()):
                        verdict.problems.append(
                            f"orphan route in {name} table {in_table or 'main'}: {route}"
                        )
                    elif in_table not in MAIN_TABLES and _table(in_table) not in mine:
                        verdict.problems.append(f"orphan route table {in_table} in {name}: {route}")
        except RuntimeError:
            continue  # the netns went while we looked
        verdict.figures["netns_checked"] += 1
    if (rules(4), rules(6)) != init_rules:
        verdict.problems.append(f"init_net's policy rules changed: {rules(4)} {rules(6)}")
    for family in (4, 6):
        for route in ip_json(f"-{family}", "route", "show", "table", "all"):
            if _table(route.get("table")) in RDMAD_TABLES:
                verdict.problems.append(f"a route in rdmad's table range in init_net: {route}")
    return verdict


def _table(table: Any) -> int:
    """A rule's or route's table as a number (ip's JSON names the kernel's own)."""
    try:
        return int(table)
    except (TypeError, ValueError):
        return -1


def check_init_macvlans(node: Node, verdict: Verdict) -> None:
    hosts = {d.pair.host for d in node.devices.values()}
    by_index = {int(x["ifindex"]): x["ifname"] for x in ip_json("link", "show")}
    for x in ip_json("-d", "link", "show"):
        if x.get("linkinfo", {}).get("info_kind") != "macvlan":
            continue
        parent = x.get("link") or by_index.get(int(x.get("link_index", 0)), "")
        if parent in hosts:
            verdict.problems.append(f"orphan macvlan {x['ifname']} on {parent} in init_net")


CLAIM_ID = re.compile(r"[0-9a-f]{16}")


@dataclass
class Spec:
    nodes: set[str]
    env: dict[str, str]


def read_specs(node: Node) -> tuple[dict[str, Spec], dict[str, Spec]]:
    """The node's CDI specs by their first device name: a claim's (its id), and a pod's (its
    pod CDI name, rdmad/daemon/cdi.py); each with the device nodes it injects and its env."""
    claims: dict[str, Spec] = {}
    pods: dict[str, Spec] = {}
    for path in node.daemon.cdi_dir.glob("*.json"):
        try:
            spec = json.loads(path.read_text())
        except (OSError, ValueError):
            continue  # removed while we read
        name = str(spec["devices"][0]["name"])
        edits = [d["containerEdits"] for d in spec["devices"]]
        nodes = {str(n["path"]) for e in edits for n in e["deviceNodes"]}
        env = dict(str(v).split("=", 1) for v in edits[0].get("env", []))
        (claims if CLAIM_ID.fullmatch(name) else pods)[name] = Spec(nodes, env)
    return claims, pods


def check_specs(
    node: Node, view: DaemonView, props: dict[str, dict[str, Any]], verdict: Verdict
) -> set[str]:
    """Each listed claim has its spec and each claim spec its claim; a pod's spec is named
    by a live claim and injects only device nodes of live claims; the specs of one netns's
    claims, and the pod specs they name, agree on each env key. The claim ids with a spec."""
    listed = {c[0] for c in view.claims}
    claims, pods = read_specs(node)
    if set(claims) != listed:
        verdict.problems.append(
            f"CDI specs without claims {sorted(set(claims) - listed)}, claims without specs "
            f"{sorted(listed - set(claims))}"
        )
    held = set().union(*(claims[c].nodes for c in listed if c in claims))
    named = {str(p.get("PodCdiName", "")) for p in props.values()} - {""}
    for name, spec in pods.items():
        if not spec.nodes or not spec.nodes <= held:
            verdict.problems.append(
                f"pod CDI spec {name} injects {sorted(spec.nodes - held)}: no claim"
            )
        if name not in named:
            verdict.problems.append(f"pod CDI spec {name}: no listed claim gives that name")
    verdict.figures["pod_specs"] += len(pods)
    by_netns: dict[str, list[str]] = {}
    for cid, _device, netns, _ifname in view.claims:
        if netns:  # a held claim's spec is its own until its pod's netns exists
            by_netns.setdefault(netns, []).append(cid)
    for netns, cids in by_netns.items():
        specs = {f"claim {c}": claims[c] for c in cids if c in claims}
        for c in cids:
            pod_name = str(props.get(c, {}).get("PodCdiName", ""))
            if pod_name in pods:
                specs[f"pod {pod_name}"] = pods[pod_name]
        values: dict[str, dict[str, str]] = {}
        for label, spec in specs.items():
            for key, value in spec.env.items():
                values.setdefault(key, {})[label] = value
        for key, seen in values.items():
            if len(set(seen.values())) > 1 or len(seen) != len(specs):
                verdict.problems.append(f"the specs of {netns}'s pod disagree on {key}: {seen}")
        verdict.figures["pods_checked"] += len(specs) > 1
    return set(claims)


def check_log(node: Node, verdict: Verdict) -> None:
    """A traceback in rdmad's log (all its runs: each appends to it) is a violation: the
    record it follows and the exception it ends with."""
    lines = node.daemon.log().splitlines()
    for i, line in enumerate(lines):
        if line.startswith("Traceback"):
            after = next((x for x in lines[i + 1 :] if x and not x[0].isspace()), "?")
            before = lines[i - 1] if i else ""
            verdict.problems.append(f"rdmad ({node.name}) logged a traceback: {before} ... {after}")
    verdict.figures["log_lines"] = len(lines)


async def claim_props(client: Client, view: DaemonView) -> dict[str, dict[str, Any]]:
    """Each listed claim's io.rdmad1.Claim properties (RouteTable, PodCdiName), by id; a
    claim that ended since ListClaims has none (the next try of the check sees it gone)."""
    out = {}
    for cid, *_rest in view.claims:
        try:
            (props,) = await client.call_raw(
                BUS_NAME, f"{MANAGER_PATH}/claim/{cid}", PROPERTIES, "GetAll", "s", [CLAIM_IFACE]
            )
        except DBusCallError:
            continue
        out[cid] = {k: v.value for k, v in props.items()}
    return out


async def check_exporter(node: Node, listed: set[str], verdict: Verdict) -> set[str]:
    """The exporter read rdmad (rdmad_up 1: rdmad is up at a check, so 0 is the exporter's
    failure, and would leave no claim series to compare) and its rdmad_claim_info series
    are ListClaims'; the claims it exported."""
    exporter = node.exporter
    assert exporter is not None
    samples = await exporter.scrape()
    exported = {dict(k[1])["claim"] for k in samples if k[0] == "rdmad_claim_info"}
    up = samples.get(("rdmad_up", ()))
    if up != 1.0:
        said = "; ".join(exporter.log[-3:]) or "nothing"
        verdict.problems.append(
            f"exporter ({node.name}) says rdmad_up {up} with rdmad up; its stderr ends: {said}"
        )
    elif exported != listed:
        verdict.problems.append(
            f"exporter's claims {sorted(exported)} are not ListClaims' {sorted(listed)}"
        )
    return exported


async def check_node(
    node: Node, slots: list[Slot], acks: dict[str, float]
) -> tuple[Verdict, DaemonView, dict[str, dict[str, Any]]]:
    verdict = Verdict(node.problems[:])
    client = await Client.connect(node.bus.address, signals=False)
    try:
        view = await daemon_view(client)
        props = await claim_props(client, view)
    finally:
        client.close()
    listed = {c[0] for c in view.claims}
    # Only a shared-mode node makes macvlans; the slots hold the other node's claims too.
    watched = _slot_names(slots) if node.name == "shared" else []
    report = compare(without_unmoved(view, verdict), node.nics(), node.settings, watched)
    if report.problems:
        problems = judge_unnamed(view, report.problems, verdict)
        verdict.problems += judge_stranded(problems, verdict)
    verdict.figures.update(
        free=report.free,
        claimed=report.claimed,
        shared_claims=report.shared_claims,
        destroyed=report.destroyed,
        listed=len(listed),
    )
    check_init_macvlans(node, verdict)
    check_log(node, verdict)
    specs = check_specs(node, view, props, verdict)
    exported = await check_exporter(node, listed, verdict)
    monitor = node.monitor
    acked = {**{c: t for c, t in monitor.claimed.items()}, **acks}
    for cid, when in acked.items():
        if cid in listed:
            verdict.figures["acked_live"] += 1
        elif monitor.released.get(cid):
            verdict.figures[f"acked_released_{monitor.released[cid]}"] += 1
        elif not monitor.listening_since(when) and cid not in specs | exported:
            verdict.figures["acked_ended_unseen"] += 1  # ended while the monitor was down
        else:
            witnessed = monitor.witnessed_release(cid)
            verdict.problems.append(
                f"LOST claim {cid}: acknowledged, not listed, and no Released while "
                "rdmactl monitor listened; a second subscriber "
                + (f"saw Released({witnessed})" if witnessed else "saw no Released either")
            )
    return verdict, view, props


async def settled(
    nodes: dict[str, Node], slots: list[Slot], init_rules: Any, acks: dict[str, dict[str, float]]
) -> dict[str, Verdict]:
    """Each node's verdict (and "routing", over both) once they hold, or the last ones after
    SETTLE_S seconds and a second pass: rdmad learns of netns deaths and netdev moves from
    kernel events, a moment after them; and under TCG one pass outlasts SETTLE_S, while
    what changed during it (podman's own CNI DEL after a kill -9) must be read again."""
    deadline, passes = time.monotonic() + SETTLE_S, 0
    while True:
        passes += 1
        verdicts: dict[str, Verdict] = {}
        views = []
        props: dict[str, dict[str, Any]] = {}
        for name, node in nodes.items():
            try:
                verdicts[name], view, mine = await check_node(node, slots, acks.get(name, {}))
            # The bus closed the checker's connection, or rdmad's (NoReply, ServiceUnknown):
            # retried; an exit of rdmad's that no fault caused is the supervisor's problem.
            except (*BUS_LOST, DBusCallError) as exc:
                verdicts[name], view = Verdict([f"bus unreadable: {exc!r}"]), DaemonView({}, [])
                mine = {}
            views.append(view)
            props |= mine
        verdicts["routing"] = check_routing(views, props, slots, init_rules)
        if not any(v.problems for v in verdicts.values()):
            return verdicts
        if time.monotonic() > deadline and passes > 1:
            return verdicts
        await asyncio.sleep(0.5)


def growth(node: Node, seconds: float) -> tuple[str, list[str]]:
    """rdmad's RSS and fds in the first and the last quarter of the soak (each restart
    starts afresh, so the last quarter can only be lower for that): the figures, and a
    problem if the last quarter's peak is over the bound."""
    first = [s for s in node.samples if s[0] < seconds / 4]
    last = [s for s in node.samples if s[0] >= seconds * 3 / 4]
    if not first or not last:
        return f"{node.name}: too few samples ({len(node.samples)})", []
    rss0, rss1 = max(s[2] for s in first), max(s[2] for s in last)
    fds0, fds1 = max(s[3] for s in first), max(s[3] for s in last)
    line = (
        f"{node.name}: rdmad peak RSS {rss0 // 1024} MiB in the first quarter, "
        f"{rss1 // 1024} MiB in the last; peak fds {fds0} -> {fds1} "
        f"({len(node.samples)} samples)"
    )
    problems = []
    if rss1 > rss0 * RSS_GROWTH + RSS_SLACK_KIB:
        problems.append(f"{node.name}: rdmad RSS grew beyond the bound: {line}")
    if fds1 > fds0 + FD_SLACK:
        problems.append(f"{node.name}: rdmad fds grew beyond the bound: {line}")
    return line, problems


# The bound: the last quarter's peak RSS at most 1.25x the first quarter's + 16 MiB, its
# peak fd count at most the first's + 16.
RSS_GROWTH, RSS_SLACK_KIB, FD_SLACK = 1.25, 16 * 1024, 16
