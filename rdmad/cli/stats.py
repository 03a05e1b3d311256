"""`rdmactl stats [DEVICE|CLAIM]`: counters of devices and claims, and rdmad's own statistics.

Its table and JSON shape (--json, --watch): docs/metrics.md#rdmactl-stats.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from typing import TYPE_CHECKING, Any, TextIO

from dbus_fast.errors import DBusError

from rdmad.bus.argtypes import positive_seconds
from rdmad.bus.names import CLAIM_IFACE, DEVICE_IFACE
from rdmad.cli.table import table
from rdmad.errors import NoSuchClaim, NoSuchDevice

if TYPE_CHECKING:
    from rdmad.bus.client import Client

# Clears the terminal from the top-left corner down, so each frame replaces the last.
HOME_AND_CLEAR = "\x1b[H\x1b[J"


def ports_json(ports: list[Any]) -> list[dict[str, Any]]:
    return [{"port": int(p), "counters": dict(sorted(c.items()))} for p, c in ports]


async def _counters(c: Client, path: str, interface: str) -> tuple[str, list[dict[str, Any]]]:
    scope, ports = await c.call("GetCounters", path=path, interface=interface)
    return str(scope), ports_json(ports)


async def rdma_usage(c: Client, path: str) -> dict[str, Any] | None:
    """The claim's device in its cgroup (Claim.GetRdmaUsage); None without a cgroup."""
    cgroup, current, limit = await c.call("GetRdmaUsage", path=path, interface=CLAIM_IFACE)
    if not cgroup:
        return None
    return {"cgroup": cgroup, "current": dict(current), "max": dict(limit)}


def rdma_rows(label: str, rdma: dict[str, Any], rates: bool) -> list[list[Any]]:
    """A claim's usage of its cgroup's RDMA resources, as USED/LIMIT ("max": none)."""
    return [
        [
            label,
            "cgroup",
            "-",
            f"rdma.{name}",
            f"{rdma['current'].get(name, 0)}/{rdma['max'].get(name, 'max')}",
        ]
        + (["-"] if rates else [])
        for name in ("hca_handle", "hca_object")
    ]


async def collect(c: Client, target: str | None) -> dict[str, Any]:
    """Read the counters now. A device that vanishes between the listing and its read is
    left out; a DEVICE or CLAIM the user named must be there."""
    (devices,) = await c.call("ListDevices")
    (claims,) = await c.call("ListClaims")
    dev_rows = [d for d in devices if target in (None, d[0])]
    claim_rows = [r for r in claims if target in (None, r[0])]
    if target is not None and not dev_rows and not claim_rows:
        raise DBusError(NoSuchDevice.dbus_name, f"no RDMA device or claim {target!r}")
    out: dict[str, Any] = {"devices": [], "claims": []}
    for name, _state, _netdev, path in dev_rows:
        try:
            scope, ports = await _counters(c, path, DEVICE_IFACE)
        except DBusError as e:
            if target is None and e.type == NoSuchDevice.dbus_name:
                continue
            raise
        out["devices"].append({"device": name, "scope": scope, "ports": ports})
    for claim_id, device, netns, _ifname, owner, path in claim_rows:
        try:
            scope, ports = await _counters(c, path, CLAIM_IFACE)
            rdma = await rdma_usage(c, path)
        except DBusError as e:
            if target is None and e.type in (NoSuchDevice.dbus_name, NoSuchClaim.dbus_name):
                continue
            raise
        out["claims"].append(
            {
                "claim": claim_id,
                "device": device,
                "netns": netns,
                "owner": owner,
                "scope": scope,
                "ports": ports,
                **({"rdma": rdma} if rdma else {}),
            }
        )
    if target is None:
        (stats,) = await c.call("GetStatistics")
        out["operations"] = operations_json({k: v.value for k, v in stats.items()})
    return out


def operations_json(stats: dict[str, Any]) -> dict[str, Any]:
    def latency(h: Any) -> dict[str, Any]:
        _buckets, total, count = h
        return {"count": count, "sum_seconds": total}

    return {
        "claims": stats["claims"],
        "releases": dict(stats["releases"]),
        "errors": [{"operation": op, "error": name, "count": n} for op, name, n in stats["errors"]],
        "claim_latency": latency(stats["claim_latency"]),
        "release_latency": latency(stats["release_latency"]),
    }


def _objects(data: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """(label, entry) for every device and claim, in output order."""
    return [(d["device"], d) for d in data["devices"]] + [
        (f"claim {c['claim']} ({c['device']})", c) for c in data["claims"]
    ]


def add_rates(now: dict[str, Any], before: dict[str, Any], seconds: float) -> None:
    """Per-second rates of each counter since `before` (counters that went down, as on a
    re-created device, have no rate)."""
    old = {
        (label, p["port"]): p["counters"]
        for label, entry in _objects(before)
        for p in entry["ports"]
    }
    for label, entry in _objects(now):
        for p in entry["ports"]:
            prev = old.get((label, p["port"]), {})
            p["rates"] = {
                k: (v - prev[k]) / seconds
                for k, v in p["counters"].items()
                if k in prev and v >= prev[k]
            }


def render(data: dict[str, Any], *, rates: bool) -> str:
    rows = []
    for label, entry in _objects(data):
        for p in entry["ports"]:
            if not p["counters"]:  # a port the kernel reads no counters of: shown, as "-"
                rows.append([label, entry["scope"], p["port"], "", ""] + ([""] if rates else []))
            for name, value in p["counters"].items():
                row = [label, entry["scope"], p["port"], name, value]
                if rates:
                    rate = p.get("rates", {}).get(name)
                    row.append("-" if rate is None else f"{rate:.1f}")
                rows.append(row)
        if "rdma" in entry:
            rows.extend(rdma_rows(label, entry["rdma"], rates))
    headers = ["OBJECT", "SCOPE", "PORT", "COUNTER", "VALUE"] + (["PER SECOND"] if rates else [])
    text = table(headers, rows) if rows else "no counters"
    ops = data.get("operations")
    if ops is not None:
        errors = sum(e["count"] for e in ops["errors"])
        releases = sum(ops["releases"].values())
        text += f"\nrdmad: {ops['claims']} claims, {releases} releases, {errors} errors"
    return text


async def cmd_stats(c: Client, a: argparse.Namespace, out: TextIO) -> None:
    data = await collect(c, a.target)
    if not a.watch:
        print(json.dumps(data) if a.json else render(data, rates=False), file=out)
        return
    taken = time.monotonic()
    terminal, frames = out.isatty(), 0

    def show(text: str) -> None:
        """A frame: in place on a terminal; elsewhere (a file, a pipe) after a blank line."""
        nonlocal frames
        print(HOME_AND_CLEAR + text if terminal else "\n" * min(frames, 1) + text, file=out)
        out.flush()
        frames += 1

    if not a.json:  # the counters at once, as top shows them; their rates from the next frame
        show(render(data, rates=True))
    while True:
        await asyncio.sleep(a.interval or DEFAULT_INTERVAL)
        now, now_taken = await collect(c, a.target), time.monotonic()
        add_rates(now, data, now_taken - taken)
        data, taken = now, now_taken
        if a.json:
            print(json.dumps(data), file=out, flush=True)
        else:
            show(render(data, rates=True))


DEFAULT_INTERVAL = 1.0


def check_stats_arguments(args: argparse.Namespace) -> str | None:
    if args.interval is not None and not args.watch:
        return "--interval only goes with --watch"
    return None


def stats_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("target", nargs="?", metavar="DEVICE|CLAIM", help="one device or claim id")
    p.add_argument(
        "--watch",
        action="store_true",
        help="refresh in place with per-second rates until Ctrl-C (with --json: one object "
        "per interval)",
    )
    p.add_argument(
        "--interval",
        type=positive_seconds,
        metavar="SECONDS",
        help=f"--watch period (default {DEFAULT_INTERVAL:g})",
    )
