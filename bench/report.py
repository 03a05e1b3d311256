"""results.md (one table, notes, before/after) and the PNG plots."""

from __future__ import annotations

import os
import platform
import subprocess
import time
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # no display on a CI runner
import matplotlib.pyplot as plt

from bench.common import BENCH_DIR, Params, Results
from bench.stats import pct


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
    plots = write_plots(res, out)
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
    lines += ["", "## Plots", ""] + [f"![{name}]({name})" for name in plots]
    lines += ["", "## Run", "", "| scenario | seconds |", "|---|---|"]
    lines += [f"| {k} | {v:.1f} |" for k, v in res.scenario_seconds.items()]
    if res.errors:
        lines += ["", "## Errors", ""] + [f"```\n{e}\n```" for e in res.errors]
    (out / "results.md").write_text("\n".join(lines) + "\n")


def _cdf(ax: Any, samples: list[float], label: str) -> None:
    s = sorted(samples)
    ax.plot(
        s,
        [(i + 1) / len(s) for i in range(len(s))],
        label=f"{label} (p99 {pct(s, 99):.1f})",
        drawstyle="steps-post",
    )


def write_plots(res: Results, out: Path) -> list[str]:
    written: list[str] = []

    def save(fig: Any, name: str) -> None:
        fig.tight_layout()
        fig.savefig(out / name, dpi=110)
        plt.close(fig)
        written.append(name)

    groups = [
        ("latency-claim-release.png", ("Claim:", "Release:")),
        ("latency-shared.png", ("Shared claim:", "Shared release:")),
        ("reclaim-netns-death.png", ("Reclaim whole", "Reclaim shared")),
    ]
    for fname, prefixes in groups:
        if not any(k.startswith(prefixes) for k in res.dists):
            continue
        fig, axes = plt.subplots(1, len(prefixes), figsize=(12, 4.5))
        for ax, prefix in zip(axes, prefixes, strict=True):
            for name, s in res.dists.items():
                if name.startswith(prefix) and s:
                    _cdf(ax, s, name.split(":", 1)[1].strip())
            ax.set_xscale("log")
            ax.set_xlabel("ms (log)")
            ax.set_ylabel("fraction of reps")
            ax.set_title(prefix.rstrip(":") + " latency CDF")
            ax.grid(True, which="both", alpha=0.3)
            ax.legend(fontsize=8)
        save(fig, fname)

    hists = [(k, v) for k, v in res.dists.items() if k.startswith(("ListDevices N=", "Claim N="))]
    if hists:
        fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
        for ax, prefix in zip(axes, ("ListDevices", "Claim N"), strict=True):
            for name, s in hists:
                if name.startswith(prefix):
                    ax.hist(s, bins=40, alpha=0.5, label=name)
            ax.set_xlabel("ms")
            ax.set_ylabel("reps")
            ax.set_title(f"{prefix.split()[0]} latency by N")
            ax.legend(fontsize=8)
        save(fig, "latency-by-n.png")

    scale = res.curves.get("scale")
    if scale and scale["n"]:
        n = scale["n"]
        fig, axes = plt.subplots(1, 5, figsize=(20, 4))
        panels = [
            ("start to READY=1 (ms)", ["start_ms"], 1000.0),
            ("RSS (MB)", ["rss_mb"], 60.0),
            ("ListDevices (ms)", ["list_p50_ms", "list_p90_ms"], 5.0),
            (
                "claim / release, settled (ms)",
                ["claim_p50_ms", "claim_p90_ms", "release_p50_ms", "release_p90_ms"],
                None,
            ),
            ("daemon CPU per operation (ms)", ["cpu_claim_ms", "cpu_release_ms"], None),
        ]
        for ax, (title, keys, target) in zip(axes, panels, strict=True):
            for key in keys:
                ax.plot(n, scale[key], marker="o", label=key)
            if target is not None:
                ax.axhline(target, color="red", linestyle="--", label="target")
            ax.set_xscale("symlog", base=2)
            ax.set_xlabel("interfaces on the node")
            ax.set_title(title)
            ax.grid(True, alpha=0.3)
            ax.legend(fontsize=7)
        save(fig, "scaling.png")

    load = [(k, v) for k, v in res.dists.items() if k.startswith("Claim+release under")]
    if load:
        fig, ax = plt.subplots(figsize=(6, 4))
        for name, s in load:
            _cdf(ax, s, name)
        ax.set_xscale("log")
        ax.set_xlabel("ms (log)")
        ax.set_title("per-op latency under concurrent clients")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
        save(fig, "throughput.png")
    return written
