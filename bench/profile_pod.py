"""rdmad's own work for an 8-rail pod's claims, counted where a loaded host cannot move it:
N pods of 8 whole-device claims, back to back from one client (bench.pod's back-to-back
column, on the sim backend), the daemon under one of

  strace:    its system calls per claim, by name, and what they do: fsyncs, files
             written (opened for writing), sockets opened, netlink dumps asked for
             (on init_net's sockets: strace cannot decode those made in a pod's netns);
             and the wall time inside them (-T), the waits (epoll_wait, futex, poll:
             idle threads) apart: a netlink request is answered inside its send(), so
             that time is the kernel's work for it (strace adds its own to each call);
  cprofile:  cProfile on the event loop's thread, timed by that thread's CPU clock: the
             split by function (its own overhead is in the times);
  callgrind: valgrind's callgrind, the instructions the daemon's process ran (Ir: all of
             its user space, interpreter included; not the kernel's work for its calls).

Counted from before a pod's first claim until SETTLE_S after its last reply, so the kernel
events a claim leaves to the loop are in; the releases are not. Run it in a netns of its
own, or the host's other link events (other runs' veths) are counted too. Not in bench.run
(minutes under callgrind).

    ip netns add prof && ip netns exec prof ip link set lo up
    ip netns exec prof python -m bench.profile_pod [--pods N] [--tool strace|callgrind|cprofile]
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import cProfile
import os
import pstats
import re
import runpy
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

from bench.common import claim, many_veths, release
from bench.pod import RAILS, pod_rails, rail_options
from testbed.bus import start_private_bus
from testbed.daemon import Client, RdmadProcess
from testbed.net import temp_netns

POD = "profpod"
SETTLE_S = 0.5  # the claims' own kernel events read; IPv6 DAD's GID re-reads are later
_DUMP = re.compile(r"nlmsg_type=(\w+), nlmsg_flags=[\w|]*NLM_F_DUMP")
_CALL = re.compile(r"^\d+\s+(?:<\.\.\. )?(\w+)(?:\(| resumed>)")
_TOOK = re.compile(r"<(\d+\.\d+)>$")
_WAITS = frozenset({"epoll_wait", "futex", "poll", "ppoll"})  # a thread with nothing to do
_NLTYPE = re.compile(r"nlmsg_type=(\w+)")
# rtnetlink's types, for the sockets made in a pod's netns, whose messages strace shows raw
_RTM = {"0x12": "GETLINK", "0x13": "SETLINK", "0x14": "NEWADDR", "0x16": "GETADDR"}
_RTM |= {"0x18": "NEWROUTE", "0x1a": "GETROUTE", "0x20": "NEWRULE", "0x22": "GETRULE"}


def _sent(line: str) -> str:
    """What a sendto() sent: a netlink request by type (in a pod's netns: "(in netns)"),
    a D-Bus message, or a byte that wakes the loop."""
    if t := _NLTYPE.search(line):
        kind = t.group(1)
        return f"sendto {_RTM[kind]} (in netns)" if kind in _RTM else f"sendto {kind}"
    return "sendto (loop wake-up)" if '"\\0", 1,' in line else "sendto (D-Bus)"


class ToolRdmad(RdmadProcess):
    """rdmad.daemon started through a tool: `prefix` before the interpreter."""

    prefix: list[str] = []

    def argv(self) -> list[str]:
        return [*self.prefix, *super().argv()]


async def _pod(c: Client, netns: str) -> list[str]:
    return [await claim(c, f"sim{r.index}", netns, rail_options(r, POD)) for r in pod_rails(0)]


async def _release_all(c: Client) -> None:
    for row in await c.manager("ListClaims"):
        await release(c, row[0])
    await asyncio.sleep(0.3)


async def _run(tool: str, pods: int, out: Path) -> str:
    workdir = Path(tempfile.mkdtemp(prefix="rdmad-profpod-", dir="/dev/shm"))
    trace = out / f"{tool}.out"
    if tool == "callgrind":
        ToolRdmad.prefix = [
            "valgrind", "--tool=callgrind", "--instr-atstart=no", f"--callgrind-out-file={trace}",
        ]  # fmt: skip
    elif tool == "cprofile":
        ToolRdmad.prefix = [sys.executable, "-m", "bench.profile_pod", "--daemon", str(trace), "--"]
    with (
        start_private_bus() as bus,
        many_veths(RAILS, "q", up=True) as nics,
        temp_netns("rpp") as ns,
    ):
        d = ToolRdmad(bus.address, workdir, nics.sim_spec(), "shared", ["--log-level", "info"])
        await d.start(timeout=600)
        assert d.proc is not None
        pid = d.proc.pid
        c = await Client.connect(bus.address, signals=False)
        try:
            await _pod(c, ns)  # warm-up: first-call costs (imports, caches) out
            await _release_all(c)
            for _ in range(pods):
                stop = await _counting(tool, pid, trace, c)
                await _pod(c, ns)
                await asyncio.sleep(SETTLE_S)
                await stop()
                await _release_all(c)
        finally:
            c.close()
            await d.stop(timeout=300)
    if tool == "callgrind":
        return _callgrind_summary(trace, pods)
    if tool == "cprofile":
        return _cprofile_summary(trace, pods * RAILS)
    return _strace_summary(trace, pods * RAILS)


async def _counting(tool: str, pid: int, trace: Path, c: Client) -> Callable[[], Awaitable[None]]:
    """Start counting the daemon's work; returns what stops it."""
    if tool == "cprofile":
        os.kill(pid, signal.SIGUSR1)
        await c.manager("GetDevice", "s", "sim0")

        async def dump() -> None:
            os.kill(pid, signal.SIGUSR2)
            await c.manager("GetDevice", "s", "sim0")  # the loop ran since: dumped

        return dump
    if tool == "callgrind":
        _callgrind_control(pid, "on")
        await c.manager("GetDevice", "s", "sim0")  # the loop ran since the switch

        async def off() -> None:
            _callgrind_control(pid, "off")

        return off
    # -f with -p: every thread of the daemon; appended to over the pods
    strace = subprocess.Popen(  # noqa: ASYNC220 (it runs beside, until detach)
        ["strace", "-f", "-qq", "-yy", "-T", "-s", "64", "-p", str(pid), "-A", "-o", str(trace)],
        stderr=subprocess.PIPE,
    )
    await asyncio.sleep(0.5)  # attached (strace prints nothing to say so)
    await c.manager("GetDevice", "s", "sim0")

    async def detach() -> None:
        strace.send_signal(signal.SIGINT)
        await asyncio.to_thread(strace.wait)

    return detach


def _callgrind_control(pid: int, state: str) -> None:
    subprocess.run(["callgrind_control", "-i", state, str(pid)], check=True, capture_output=True)


def _callgrind_summary(path: Path, pods: int) -> str:
    total = 0
    for part in path.parent.glob(path.name + "*"):  # one file per thread, if split
        m = re.search(r"^totals: (\d+)", part.read_text(errors="replace"), re.M)
        total += int(m.group(1)) if m else 0
    per_pod = total / pods / 1e6
    return f"callgrind: {per_pod:.1f} M Ir per pod, {per_pod / RAILS:.2f} M per claim"


def _profiled_daemon(out: Path, argv: list[str]) -> None:
    """rdmad's daemon (`argv`: its interpreter's), its loop thread profiled between SIGUSR1
    and SIGUSR2; the counts of every window summed into `out`."""
    prof = cProfile.Profile(time.thread_time)

    def dump(*_: object) -> None:
        prof.disable()
        prof.dump_stats(out)

    signal.signal(signal.SIGUSR1, lambda *_: prof.enable())
    signal.signal(signal.SIGUSR2, dump)
    module = argv[argv.index("-m") + 1]
    sys.argv = [module, *argv[argv.index("-m") + 2 :]]
    runpy.run_module(module, run_name="__main__", alter_sys=True)


def _cprofile_summary(path: Path, claims: int) -> str:
    stats = pstats.Stats(str(path))
    cpu = stats.total_tt  # type: ignore[attr-defined]
    lines = [f"cprofile: {cpu / claims * 1000:.2f} ms of the loop's CPU per claim"]
    rows = sorted(stats.stats.items(), key=lambda kv: -kv[1][3])  # type: ignore[attr-defined]
    for (file, line, fn), (_cc, nc, _tt, ct, _callers) in rows[:60]:
        where = f"{Path(file).parent.name}/{Path(file).name}:{line}"
        lines.append(f"  {ct / cpu * 100:5.1f}% {nc / claims:6.2f}/claim {fn} ({where})")
    return "\n".join(lines)


def _strace_summary(path: Path, claims: int) -> str:
    calls: collections.Counter[str] = collections.Counter()
    what: collections.Counter[str] = collections.Counter()
    took: collections.defaultdict[str, float] = collections.defaultdict(float)  # s in each call
    started: dict[str, str] = {}  # thread -> the start of its call another one cut
    for line in path.read_text(errors="replace").splitlines():
        m = _CALL.match(line)
        if m is None:
            continue
        name, thread = m.group(1), line.split(None, 1)[0]
        if line.endswith("<unfinished ...>"):
            started[thread] = line
        if t := _TOOK.search(line):  # on the line that finished the call
            whole = started.pop(thread, "") + line if "resumed>" in line else line
            took[_sent(whole) if name == "sendto" else name] += float(t.group(1))
        if "resumed>" in line:
            continue
        calls[name] += 1
        if name in ("fsync", "fdatasync"):
            what["fsync"] += 1
        elif name == "openat" and ("O_WRONLY" in line or "O_RDWR" in line):
            what["files opened for writing"] += 1
        elif name == "openat":
            what["files opened for reading"] += 1
        elif name in ("sendto", "sendmsg") and (dump := _DUMP.search(line)):
            what[f"netlink dumps: {dump.group(1)}"] += 1
        elif name == "socket":
            what["sockets opened"] += 1
    lines = [f"strace: {calls.total() / claims:.1f} system calls per claim"]
    lines += [f"  {n / claims:6.2f} {k}" for k, n in what.most_common()]
    lines += [f"  {n / claims:6.2f} {k}()" for k, n in calls.most_common(25)]
    busy = {k: t for k, t in took.items() if k not in _WAITS}
    lines.append(f"strace -T: {sum(busy.values()) / claims * 1e3:.3f} ms in calls per claim,")
    lines[-1] += " waits apart; by call:"
    lines += [
        f"  {t / claims * 1e3:6.3f} ms {k}"
        for k, t in sorted(busy.items(), key=lambda kv: -kv[1])[:15]
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.profile_pod", description=__doc__)
    ap.add_argument("--pods", type=int, default=5)
    ap.add_argument("--tool", choices=("strace", "callgrind", "cprofile"), default="strace")
    ap.add_argument("--daemon", type=Path, help=argparse.SUPPRESS)  # cprofile's daemon
    ap.add_argument("argv", nargs="*", help=argparse.SUPPRESS)
    ap.add_argument("--out", type=Path, default=Path(tempfile.mkdtemp(prefix="rdmad-profpod-")))
    args = ap.parse_args(argv)
    if args.daemon:
        _profiled_daemon(args.daemon, args.argv)
        return 0
    args.out.mkdir(parents=True, exist_ok=True)
    print(asyncio.run(_run(args.tool, args.pods, args.out)))
    print(f"(files in {args.out})", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
