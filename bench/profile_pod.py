"""rdmad's own work for an 8-rail pod's claims, counted where a loaded host cannot move it:
N pods of 8 whole-device claims, back to back from one client (bench.pod's back-to-back
column, on the sim backend), the daemon under one of

  cprofile:  bench.profiled_daemon's cProfile: every Python call, timed by the loop
             thread's CPU clock (the split by function; its own overhead is in the times);
  callgrind: valgrind's callgrind, the instructions the daemon's process ran (Ir: all of
             its user space, interpreter included; not the kernel's work for its calls).

Counted from before a pod's first claim until SETTLE_S after its last reply, so the work a
claim leaves to the loop (its kernel events, the device's re-read, the GID re-reads that the
end of IPv6 duplicate address detection asks for about a second later) is in; the releases
are not. Run it in a netns of its own, or the host's other link events (other test runs'
veths) are counted too. Not in bench.run (minutes under callgrind).

    ip netns add prof && ip netns exec prof ip link set lo up
    ip netns exec prof python -m bench.profile_pod [--pods N] [--tool cprofile|callgrind]
"""

from __future__ import annotations

import argparse
import asyncio
import pstats
import re
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

from bench.common import claim, many_veths, release
from bench.pod import pod_rails, rail_options
from tests.support.bus import start_private_bus
from tests.support.daemon import Client, RdmadProcess
from tests.support.net import temp_netns

POD = "profpod"
SETTLE_S = {"cprofile": 2.5, "callgrind": 5.0}  # past the claims' IPv6 DAD
TOP = 25


class ToolRdmad(RdmadProcess):
    """rdmad.daemon.main started through a profiler: `prefix` before `python -m`, `module`
    instead of rdmad.daemon.main."""

    prefix: list[str] = []
    module = "rdmad.daemon.main"

    def argv(self) -> list[str]:
        args = super().argv()
        i = args.index("rdmad.daemon.main")
        return [*self.prefix, sys.executable, "-m", self.module, *args[i + 1 :]]


async def _pod(c: Client, netns: str) -> list[str]:
    return [await claim(c, f"sim{r.index}", netns, rail_options(r, POD)) for r in pod_rails(0)]


async def _run(tool: str, pods: int, out: Path) -> str:
    workdir = Path(tempfile.mkdtemp(prefix="rdmad-profpod-", dir="/dev/shm"))
    cg_out = out / "callgrind.out"
    if tool == "callgrind":
        ToolRdmad.prefix = [
            "valgrind", "--tool=callgrind", "--instr-atstart=no", f"--callgrind-out-file={cg_out}",
        ]  # fmt: skip
    else:
        ToolRdmad.module = "bench.profiled_daemon"
    with start_private_bus() as bus, many_veths(8, "q", up=True) as nics, temp_netns("rpp") as ns:
        env = {"RDMAD_BENCH_PROFILE_DIR": str(out), "RDMAD_BENCH_PROFILER": "cprofile"}
        d = ToolRdmad(bus.address, workdir, nics.sim_spec(), "shared", ["--log-level", "info"])
        d.env = env
        await d.start(timeout=600)
        assert d.proc is not None
        pid = d.proc.pid
        c = await Client.connect(bus.address, signals=False)
        try:
            for _ in await _pod(c, ns):  # warm-up: first-call costs (imports, caches) out
                pass
            await _release_all(c)

            def counting(on: bool) -> None:
                if tool == "callgrind":
                    subprocess.run(["callgrind_control", "-i", "on" if on else "off", str(pid)],
                                   check=True, capture_output=True)  # fmt: skip
                else:
                    d.proc.send_signal(signal.SIGUSR1 if on else signal.SIGUSR2)  # type: ignore[union-attr]

            for k in range(pods):
                counting(True)
                await c.manager("GetDevice", "s", "sim0")  # the toggle is handled: loop ran
                await _pod(c, ns)
                await asyncio.sleep(SETTLE_S[tool])
                counting(False)
                await _release_all(c)
                if tool == "cprofile":
                    await _done(out, k)
        finally:
            c.close()
            await d.stop(timeout=300)
    if tool == "callgrind":
        return _callgrind_summary(cg_out, pods)
    return _cprofile_summary([out / f"{k}.pstats" for k in range(pods)], pods)


async def _release_all(c: Client) -> None:
    rows = await c.manager("ListClaims")
    for row in rows:
        await release(c, row[0])
    await asyncio.sleep(0.3)


async def _done(out: Path, k: int) -> None:
    async with asyncio.timeout(60):
        while not (out / f"{k}.done").exists():  # noqa: ASYNC110 (another process's file)
            await asyncio.sleep(0.05)


def _callgrind_summary(path: Path, pods: int) -> str:
    text = path.read_text(errors="replace")
    m = re.search(r"^totals: (\d+)", text, re.MULTILINE)
    assert m, f"no totals in {path}"
    ir = int(m.group(1))
    return f"callgrind: {ir} Ir for {pods} pods: {ir / pods / 1e6:.1f} M Ir per pod"


def _cprofile_summary(paths: list[Path], pods: int) -> str:
    stats = pstats.Stats(*(str(p) for p in paths))
    calls = sum(v[1] for v in stats.stats.values())  # type: ignore[attr-defined]
    cpu = stats.total_tt  # type: ignore[attr-defined]
    lines = [f"cprofile: {calls / pods:.0f} calls, {cpu / pods * 1000:.1f} ms CPU per pod"]
    rows = sorted(stats.stats.items(), key=lambda kv: -kv[1][3])  # type: ignore[attr-defined]
    for (file, line, fn), (_cc, nc, _tt, ct, _callers) in rows:
        if "/rdmad/" in file and len(lines) <= TOP:
            lines.append(
                f"  {ct / cpu * 100:5.1f}% {nc / pods:6.1f}/pod {fn} ({Path(file).name}:{line})"
            )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.profile_pod", description=__doc__)
    ap.add_argument("--pods", type=int, default=10)
    ap.add_argument("--tool", choices=sorted(SETTLE_S), default="cprofile")
    ap.add_argument("--out", type=Path, default=Path(tempfile.mkdtemp(prefix="rdmad-profpod-")))
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    print(asyncio.run(_run(args.tool, args.pods, args.out)))
    print(f"(files in {args.out})", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
