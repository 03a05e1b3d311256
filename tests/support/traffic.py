"""RDMA traffic through a claim, with rdma-core's and perftest's own tools, both ends parsed.

Each tool runs as a server and a client inside the claimant's netns (`ip netns exec`, which
also mounts the netns's own sysfs, so libibverbs sees what that netns sees). The client
talks to the server over 127.0.0.1 (or, for rping, over the claim's address); the RDMA
traffic itself goes through the claim's device and GID. A run counts only when *both* ends
report their iterations: a tool's exit code alone can hide a one-sided success.

Soft-RoCE carries this traffic within one netns only (docs/kernel-notes.md), which is what
a loopback through the claimed device shows.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from testbed.daemon import Client
from tests.support.rdma import SYS_IB, WAIT, ash, in_netns, sh

PINGPONG_ITERS = 100
WRITE_BW_ITERS = 200
RPING_COUNT = 5

_PINGPONG = re.compile(r"^(\d+) iters in [\d.]+ seconds", re.M)
# perftest's result row: #bytes #iterations BW-peak BW-average MsgRate
_BW_ROW = re.compile(r"^\s*(\d+)\s+(\d+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s*$", re.M)
# What a client says when its server is not listening yet (the tools print no readiness).
_NOT_LISTENING = ("Couldn't connect", "Unable to init the socket connection", "REJECTED")
# A server whose client failed waits for completions that will never come: it gets this
# long to end by itself, not the whole WAIT (a minute of the 6.1 run, for each such test).
_SERVER_AFTER_FAILED_CLIENT_S = 5.0


@dataclass(frozen=True)
class Side:
    rc: int
    out: str


@dataclass(frozen=True)
class Pair:
    server: Side
    client: Side

    def both(self, parse: Callable[[str], int | None]) -> tuple[int | None, int | None]:
        return parse(self.server.out), parse(self.client.out)

    def __str__(self) -> str:
        return (
            f"server rc={self.server.rc}:\n{self.server.out}\n"
            f"client rc={self.client.rc}:\n{self.client.out}"
        )


async def _spawn(cmd: list[str], netns: str) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        *in_netns(netns, *cmd), stdout=subprocess.PIPE, stderr=subprocess.STDOUT
    )


async def _finish(proc: asyncio.subprocess.Process, within: float) -> Side:
    try:
        out, _ = await asyncio.wait_for(proc.communicate(), within)
    except TimeoutError:
        proc.kill()
        out, _ = await proc.communicate()
    return Side(proc.returncode if proc.returncode is not None else -1, out.decode())


async def run_pair(server: list[str], client: list[str], netns: str, within: float = WAIT) -> Pair:
    """Start `server`, then `client` until it reaches the server (the tools print nothing
    when they listen, so a client refused is started again); wait for both ends."""
    # The ends meet over 127.0.0.1: up in a runtime's netns, down after `ip netns add`.
    await ash("ip", "link", "set", "lo", "up", netns=netns)
    srv = await _spawn(server, netns)
    try:
        async with asyncio.timeout(within):
            while True:
                cli = await _finish(await _spawn(client, netns), within)
                refused = cli.rc != 0 and any(s in cli.out for s in _NOT_LISTENING)
                if not refused or srv.returncode is not None:
                    break
    except TimeoutError:
        cli = Side(-1, "client never reached the server")
    return Pair(await _finish(srv, within if cli.rc == 0 else _SERVER_AFTER_FAILED_CLIENT_S), cli)


def pingpong_iters(out: str) -> int | None:
    m = _PINGPONG.search(out)
    return int(m.group(1)) if m else None


def write_bw_row(out: str) -> tuple[int, int, float] | None:
    """(#bytes, #iterations, BW average MB/s) of perftest's result row, if it printed one."""
    m = _BW_ROW.search(out)
    return (int(m.group(1)), int(m.group(2)), float(m.group(4))) if m else None


def write_bw_iters(out: str) -> int | None:
    row = write_bw_row(out)
    return row[1] if row else None


def rping_count(out: str, *, server: bool) -> int:
    prefix = "server ping data: rdma-ping-" if server else "ping data: rdma-ping-"
    return sum(1 for line in out.splitlines() if line.startswith(prefix))


async def pingpong(netns: str, device: str, gid_index: int) -> Pair:
    cmd = ["ibv_rc_pingpong", "-d", device, "-g", str(gid_index), "-n", str(PINGPONG_ITERS)]
    return await run_pair(cmd, [*cmd, "127.0.0.1"], netns)


async def write_bw(netns: str, device: str, gid_index: int) -> Pair:
    # -F: under a VM the CPU frequency looks unstable, which perftest would refuse
    cmd = ["ib_write_bw", "-F", "-d", device, "-x", str(gid_index), "-n", str(WRITE_BW_ITERS)]
    return await run_pair(cmd, [*cmd, "127.0.0.1"], netns)


async def rping(netns: str, address: str) -> Pair:
    opts = ["-a", address, "-v", "-C", str(RPING_COUNT)]
    return await run_pair(["rping", "-s", *opts], ["rping", "-c", *opts], netns)


def ibv_devices(netns: str) -> set[str]:
    """The devices libibverbs finds in `netns` (`ibv_devices`, past its two header lines;
    with none it may also say it found none and fail)."""
    res = subprocess.run(
        in_netns(netns, "ibv_devices"), capture_output=True, text=True, timeout=WAIT
    )
    return {line.split()[0] for line in res.stdout.splitlines()[2:] if line.strip()}


def cdi_env(cdi_dir: Path, claim_id: str) -> dict[str, str]:
    """The environment the claim's CDI spec gives a container."""
    spec = json.loads((cdi_dir / f"rdmad.io-rdma-{claim_id}.json").read_text())
    (device,) = spec["devices"]
    return dict(e.split("=", 1) for e in device["containerEdits"].get("env", []))


def sysfs_gid(device: str, index: int, netns: str, port: int = 1) -> str:
    """GID `index` of `device` as `netns` sees it, read by `cat` there ("" if refused)."""
    with contextlib.suppress(subprocess.CalledProcessError):
        path = f"/sys/class/infiniband/{device}/ports/{port}/gids/{index}"
        return subprocess.run(
            in_netns(netns, "cat", path), capture_output=True, text=True, check=True
        ).stdout.strip()
    return ""


# Lists a GID table's used entries ("index netdev gid"); run in a netns, whose sysfs it reads.
# A table has hundreds of entries (1024 on 6.1's rxe): one process reads them all.
_GID_TABLE = """
import os, sys
for i in sorted(os.listdir(sys.argv[1] + "/gid_attrs/ndevs"), key=int):
    try:
        with open(f"{sys.argv[1]}/gid_attrs/ndevs/{i}") as f:
            netdev = f.read().strip()
    except OSError:
        continue  # an unused entry
    with open(f"{sys.argv[1]}/gids/{i}") as f:
        print(i, netdev, f.read().strip())
"""


def link_local_gid_index(device: str, netdev: str, netns: str, port: int = 1) -> int | None:
    """The index of `netdev`'s IPv6 link-local entry in `device`'s GID table, as `netns`
    reads it (None while the kernel has not made it)."""
    table = f"{SYS_IB}/{device}/ports/{port}"
    for line in sh(sys.executable, "-c", _GID_TABLE, table, netns=netns).splitlines():
        index, named, gid = line.split()
        if named == netdev and gid.startswith("fe80:"):
            return int(index)
    return None


GidEntry = tuple[int, int, str, str, str]  # Claim.Gids: port, index, GID, type, netdev


async def gid_joined(client: Client, gid: str, since: int) -> list[GidEntry]:
    """A claim's entries for `gid`, from the first PropertiesChanged of its Gids (after
    mark `since`) that has it."""
    body = await client.wait_signal(
        "PropertiesChanged",
        lambda b: "Gids" in b[1] and gid in {g[2] for g in b[1]["Gids"].value},
        since=since,
        timeout=WAIT,
    )
    return [g for g in body[1]["Gids"].value if g[2] == gid]
