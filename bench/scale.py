"""3. Scale: N sim devices on N real veths. Start to READY=1, RSS, ListDevices latency, and
claim/release latency at N (should be flat in N)."""

from __future__ import annotations

import statistics
import subprocess
import sys
import time
from pathlib import Path

from bench.common import (
    Params,
    Results,
    Row,
    Settler,
    claim,
    claim_options,
    client,
    many_veths,
    ms_since,
    pid_of,
    rdmad,
    release,
    rss_mb,
)
from bench.stats import JUDGED, RatioCheck, p99_text, pct, spread
from tests.support.daemon import ROOT
from tests.support.net import temp_netns


def python_floor_ms() -> float:
    """Interpreter start + importing the daemon's modules: the part of 'start' that is not
    rdmad's own work (best of 3)."""
    best = float("inf")
    for _ in range(3):
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-c", "import rdmad.daemon"], check=True, cwd=ROOT)
        best = min(best, ms_since(t0))
    return best


async def run(bus: str, p: Params, res: Results, out: Path) -> None:
    curve: dict[str, list[float]] = {
        k: []
        for k in (
            "n",
            "start_ms",
            "rss_mb",
            "list_p50_ms",
            "list_p99_ms",
            "claim_p50_ms",
            "claim_p99_ms",
            "release_p50_ms",
            "release_p99_ms",
        )
    }
    floor = python_floor_ms()
    for n in p.scale_ns:
        with many_veths(n, "s") as nics:
            spec = nics.sim_spec()
            starts: list[float] = []
            for _ in range(p.starts - 1):  # extra starts, only for the start time
                t0 = time.perf_counter()
                async with rdmad(bus, spec):
                    starts.append(ms_since(t0))
            t0 = time.perf_counter()
            async with rdmad(bus, spec) as d, client(bus) as c:
                starts.append(ms_since(t0))
                rss_ready = rss_mb(pid_of(d))
                lists: list[float] = []
                for i in range(p.warmup + p.reps):
                    t0 = time.perf_counter()
                    rows = await c.manager("ListDevices")
                    if i >= p.warmup:
                        lists.append(ms_since(t0))
                assert len(rows) == n, f"ListDevices returned {len(rows)} of {n} devices"
                claims: list[float] = []
                releases: list[float] = []
                dev = f"sim{n // 2}"
                opts = claim_options("bench0", 1400, ["198.51.100.2/24"])
                settle = Settler(p)  # as in claim.py's settled pass
                with temp_netns("rbs") as netns:
                    for i in range(p.warmup + p.reps):
                        await settle()
                        t0 = time.perf_counter()
                        cid = await claim(c, dev, netns, opts)
                        a = ms_since(t0)
                        await settle()
                        t0 = time.perf_counter()
                        await release(c, cid)
                        if i >= p.warmup:
                            claims.append(a)
                            releases.append(ms_since(t0))
                rss = max(rss_ready, rss_mb(pid_of(d)))
        start = statistics.median(starts)
        res.dists[f"ListDevices N={n}"] = lists
        res.dists[f"Claim N={n}"] = claims
        for key, val in (
            ("n", n),
            ("start_ms", start),
            ("rss_mb", rss),
            ("list_p50_ms", pct(lists, 50)),
            ("list_p99_ms", pct(lists, 99)),
            ("claim_p50_ms", pct(claims, 50)),
            ("claim_p99_ms", pct(claims, 99)),
            ("release_p50_ms", pct(releases, 50)),
            ("release_p99_ms", pct(releases, 99)),
        ):
            curve[key].append(float(val))
        big = n == 1024  # where the targets are set
        res.rows.append(
            Row(
                f"3. Start to READY=1, N={n}",
                f"{start:.0f} ms (median of {len(starts)}; max {max(starts):.0f})",
                f"{floor:.0f} ms (python + imports)",
                "-",
                "-",
                "< 1 s at 1024" if big else "",
                (start < 1000) if big else None,
            )
        )
        res.rows.append(
            Row(
                f"3. RSS, N={n}",
                f"{rss:.1f} MB",
                target="< 60 MB at 1024" if big else "",
                met=(rss < 60) if big else None,
            )
        )
        res.rows.append(
            Row(
                f"3. ListDevices latency, N={n}",
                spread(lists),
                ratio=p99_text(lists),
                target="< 5 ms at p50 and p90, at 1024" if big else "",
                met=all(pct(lists, q) < 5 for q in JUDGED) if big else None,
            )
        )
        res.rows.append(
            Row(
                f"3. Claim / release latency, N={n}",
                f"{spread(claims)} / release {spread(releases)}",
            )
        )
    res.curves["scale"] = curve
    lo, hi = p.scale_ns[0], p.scale_ns[-1]
    flat = RatioCheck.of(
        f"N={hi}/N={lo}", res.dists[f"Claim N={hi}"], res.dists[f"Claim N={lo}"], 1.2
    )
    res.rows.append(
        Row(
            f"3. Claim latency flat in N ({lo} -> {hi})",
            f"p50 {curve['claim_p50_ms'][0]:.2f} -> {curve['claim_p50_ms'][-1]:.2f} ms",
            ratio=flat.text(),
            target=flat.target(),
            met=flat.met,
        )
    )
