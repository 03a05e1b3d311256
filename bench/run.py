"""Run every benchmark scenario side by side and write results.md and results.json.

    python -m bench.run            # full: N up to 1024 + 2048 others, 60 s idle -> bench/out/
    python -m bench.run --smoke    # CI: tiny N, few reps, a few seconds idle -> bench/out/smoke/

Needs root (real netns, veth, macvlan), dbus-daemon and containerd 2 (bench/README.md).
Smoke mode asserts one thing about speed (bench.scale's guard); otherwise it exits non-zero
only if a scenario fails or produces no numbers.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
import traceback
from collections.abc import Awaitable, Callable
from dataclasses import asdict
from pathlib import Path

from bench import burst, claim, cni, dra, idle, pod, podstart, scale, shared
from bench.common import BENCH_DIR, Params, Results
from bench.report import write_report
from testbed.bus import start_private_bus

Scenario = Callable[[str, Params, Results, Path], Awaitable[None]]
SCENARIOS: dict[str, Scenario] = {
    "claim": claim.run,
    "shared": shared.run,
    "cni": cni.run,
    "scale": scale.run,
    "burst": burst.run,
    "pod": pod.run,
    "dra": dra.run,
    "podstart": podstart.run,
    "idle": idle.run,
}


async def run_all(names: list[str], p: Params, out: Path, bus: str) -> Results:
    res = Results()
    for name in names:
        rows, dists = len(res.rows), len(res.dists)
        t0 = time.monotonic()
        print(f"bench: {name} ...", file=sys.stderr, flush=True)
        try:
            await SCENARIOS[name](bus, p, res, out)
            if len(res.rows) == rows and len(res.dists) == dists:
                raise RuntimeError("the scenario produced no numbers")
        except Exception:
            res.errors.append(f"{name}: {traceback.format_exc()}")
            print(f"bench: {name} FAILED\n{traceback.format_exc()}", file=sys.stderr)
        res.scenario_seconds[name] = time.monotonic() - t0
        print(f"bench: {name} done in {res.scenario_seconds[name]:.1f} s", file=sys.stderr)
    return res


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.run", description=__doc__.split("\n")[0])
    ap.add_argument("--smoke", action="store_true", help="tiny N and few reps (CI)")
    ap.add_argument(
        "--out", type=Path, help="where results go (default: bench/out, bench/out/smoke)"
    )
    ap.add_argument("--only", nargs="+", choices=list(SCENARIOS), help="run only these")
    args = ap.parse_args(argv)
    p = Params.quick() if args.smoke else Params()
    out: Path = args.out or BENCH_DIR / "out" / ("smoke" if args.smoke else "")
    out.mkdir(parents=True, exist_ok=True)
    names = args.only or list(SCENARIOS)
    t0 = time.monotonic()
    with start_private_bus() as bus:
        res = asyncio.run(run_all(names, p, out, bus.address))
    total = time.monotonic() - t0
    (out / "results.json").write_text(json.dumps(asdict(res), indent=1))
    write_report(res, p, out, total)
    print(f"bench: wrote {out}/results.md in {total:.0f} s", file=sys.stderr)
    if res.errors:
        print(f"bench: {len(res.errors)} scenario(s) failed", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
