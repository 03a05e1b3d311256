"""Profile the daemon's hot paths at N=1024 with pyinstrument: ListDevices, and claim +
release. Writes profile-<workload>.txt (pyinstrument's call tree) and puts the functions
with the most self time into results.md."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import tempfile
from collections import Counter
from pathlib import Path

from pyinstrument.renderers import ConsoleRenderer
from pyinstrument.session import Session

from bench.common import Params, Results, claim, claim_options, client, many_veths, rdmad, release
from tests.support.daemon import ROOT, RdmadProcess
from tests.support.net import temp_netns

TOP = 12


class ProfiledRdmad(RdmadProcess):
    """The same daemon, started through bench.profiled_daemon."""

    def argv(self) -> list[str]:
        args = super().argv()
        i = args.index("rdmad.daemon.main")
        return [sys.executable, "-m", "bench.profiled_daemon", *args[i + 1 :]]


async def _saved(directory: Path, k: int) -> Session:
    async with asyncio.timeout(30):
        # written by a signal handler in another process: nothing to wait on but the file
        while not (directory / f"{k}.done").exists():  # noqa: ASYNC110
            await asyncio.sleep(0.05)
    return Session.load(str(directory / f"{k}.pyisession"))


def top_self(session: Session, top: int = TOP) -> list[tuple[str, float, float]]:
    """(function (file:line), self seconds, share of the profile), most self time first.
    Sample stacks end in the function that was running (or waiting, e.g. in select)."""
    acc: Counter[str] = Counter()  # of seconds
    for stack, t in session.frame_records:
        if not stack:
            continue
        func, path, line = ([*stack[-1].split("\x00"), "", ""])[:3]
        acc[f"{func} ({_short(path)}:{line.split(chr(1))[0]})"] += t  # type: ignore[assignment]
    total = sum(acc.values()) or 1.0
    return [(name, t, t / total) for name, t in acc.most_common(top)]


def _short(path: str) -> str:
    for marker in ("site-packages/", "/lib/python3", f"{ROOT}/"):
        if marker in path:
            return path.split(marker, 1)[1]
    return path


async def run(bus: str, p: Params, res: Results, out: Path) -> None:
    n = max(netdevs for netdevs, _others in p.scale_nodes)
    prof_dir = Path(tempfile.mkdtemp(prefix="rdmad-prof-"))
    with many_veths(n, "p") as nics, temp_netns("rbp") as netns:
        os.environ["RDMAD_BENCH_PROFILE_DIR"] = str(prof_dir)
        try:
            async with rdmad(bus, nics.sim_spec(), process=ProfiledRdmad) as d, client(bus) as c:
                assert d.proc is not None
                opts = claim_options("bench0", 1400, ["198.51.100.2/24"])

                async def listdevices() -> None:
                    await c.manager("ListDevices")

                async def claim_release() -> None:
                    cid = await claim(c, "sim1", netns, opts)
                    await release(c, cid)

                workloads = {"listdevices": listdevices, "claim": claim_release}
                for k, (name, work) in enumerate(workloads.items()):
                    d.proc.send_signal(signal.SIGUSR1)
                    await c.manager("GetDevice", "s", "sim0")  # signal handled: loop ran
                    # claim+release is ~100x the cost of a ListDevices: fewer reps suffice
                    reps = p.profile_reps if name == "listdevices" else p.profile_reps // 4
                    for _ in range(reps):
                        await work()
                    d.proc.send_signal(signal.SIGUSR2)
                    session = await _saved(prof_dir, k)
                    text = ConsoleRenderer(
                        unicode=False, color=False, show_all=False, short_mode=False
                    ).render(session)
                    (out / f"profile-{name}.txt").write_text(text)
                    tops = top_self(session)
                    res.dists[f"profile {name}: self time"] = [t * 1000 for _n, t, _s in tops]
                    res.notes.append(
                        f"Profile, {name} x{reps} at N={n} "
                        f"({session.duration:.2f} s wall, {session.cpu_time:.2f} s CPU "
                        f"sampled; full tree in profile-{name}.txt). Most self time:\n"
                        + "\n".join(f"  - {s * 100:4.1f} %  {fn}" for fn, _t, s in tops)
                    )
        finally:
            os.environ.pop("RDMAD_BENCH_PROFILE_DIR", None)
