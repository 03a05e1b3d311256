"""results.md: one table, notes, before/after."""

from __future__ import annotations

import os
import platform
import subprocess
import time
from pathlib import Path
from typing import Any

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


def write_report(
    res: Results, p: Params, out: Path, seconds: float, baseline: dict[str, Any] | None
) -> None:
    mode = "smoke" if p.smoke else "full"
    lines = [
        "# rdmad benchmark results",
        "",
        f"Written by `python -m bench.run{' --smoke' if p.smoke else ''}` ({mode} mode) on "
        f"{time.strftime('%Y-%m-%d %H:%M')}, commit {_commit()}, in {seconds:.0f} s.",
        f"Host: Linux {platform.release()}, {os.cpu_count()} CPUs, Python "
        f"{platform.python_version()}, load average at the end {_load()} (other work on "
        "the host, e.g. QEMU guests, shows up as p99 outliers). Simulated RDMA backend "
        "bound to real veths; every netdev operation is real. State dir on tmpfs (as /run "
        "is in production); "
        "daemon at --log-level info. Latencies over "
        f"{p.reps} repetitions after {p.warmup} warm-up ones. Claim and release against raw "
        f"and the CLI: {p.latency_reps} repetitions settled (each operation starts "
        f"{p.settle_ms:.0f}-{p.settle_ms + p.jitter_ms:.0f} ms after the previous one ended) "
        f"and {p.back_to_back_reps} back to back, in a cycle of column orders so that each "
        "column's claim follows each column's release, its own included, equally often.",
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
    if baseline:
        lines += [
            "",
            "## Before / after",
            "",
            "rdmad column of the baseline run (`--baseline`) against this run.",
            "",
            "| scenario | before | after |",
            "|---|---|---|",
        ]
        old = {r["scenario"]: r for r in baseline.get("rows", [])}
        for r in res.rows:
            # Earlier runs measured claim/release back to back only, under the bare name.
            was = old.get(r.scenario) or old.get(r.scenario.replace(", back to back", ""))
            if was is not None and was["rdmad"] != r.rdmad:
                lines.append(f"| {r.scenario} | {was['rdmad']} | {r.rdmad} |")
    if res.notes:
        lines += ["", "## Notes", ""] + [f"- {n}" for n in res.notes]
    lines += ["", "## Run", "", "| scenario | seconds |", "|---|---|"]
    lines += [f"| {k} | {v:.1f} |" for k, v in res.scenario_seconds.items()]
    if res.errors:
        lines += ["", "## Errors", ""] + [f"```\n{e}\n```" for e in res.errors]
    (out / "results.md").write_text("\n".join(lines) + "\n")
