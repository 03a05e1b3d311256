"""results.md: one table, and how long each scenario took."""

from __future__ import annotations

import os
import platform
import subprocess
import time
from pathlib import Path

from bench.common import BENCH_DIR, Params, Results


def _mark(met: bool | None) -> str:
    return "" if met is None else ("yes" if met else "**no**")


def _commit() -> str:
    """The commit measured, "+ changes" when rdmad/ or bench/ differ from it."""

    def git(*args: str) -> str:
        res = subprocess.run(["git", "-C", str(BENCH_DIR), *args], capture_output=True, text=True)
        return res.stdout.strip()

    head = git("rev-parse", "--short", "HEAD") or "?"
    return head + (" + changes" if git("status", "--porcelain", "--", "../rdmad", ".") else "")


def _load() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def write_report(res: Results, p: Params, out: Path, seconds: float) -> None:
    mode = "smoke" if p.smoke else "full"
    lines = [
        "# rdmad benchmark results",
        "",
        f"Written by `python -m bench.run{' --smoke' if p.smoke else ''}` ({mode} mode) on "
        f"{time.strftime('%Y-%m-%d %H:%M')}, commit {_commit()}, in {seconds:.0f} s.",
        f"Host: Linux {platform.release()}, {os.cpu_count()} CPUs, Python "
        f"{platform.python_version()}, load average at the end {_load()}. Simulated RDMA "
        "backend bound to real veths; state on tmpfs; daemon at --log-level info. Latencies "
        f"over {p.reps} repetitions after {p.warmup} warm-up ones; claim and release over "
        f"{p.latency_reps}, each operation {p.settle_ms:.0f}-{p.settle_ms + p.jitter_ms:.0f} ms"
        " after the previous one, the columns taking turns (bench.columns).",
        "",
        "Cells read p50 / p90 / p99. A ratio shows each percentile with its 95% bootstrap "
        "interval in brackets; a ratio target is met only where the whole interval holds at "
        "p50 and at p90. p99 decides nothing. Method and analysis: docs/performance.md.",
        "",
        "| scenario | rdmad | raw (pyroute2) or floor | CLI | ratio | target | met? |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in res.rows:
        lines.append(
            f"| {r.scenario} | {r.rdmad} | {r.raw} | {r.cli} | {r.ratio} | "
            f"{r.target} | {_mark(r.met)} |"
        )
    lines += ["", "## Run", "", "| scenario | seconds |", "|---|---|"]
    lines += [f"| {k} | {v:.1f} |" for k, v in res.scenario_seconds.items()]
    if res.errors:
        lines += ["", "## Errors", ""] + [f"```\n{e}\n```" for e in res.errors]
    (out / "results.md").write_text("\n".join(lines) + "\n")
