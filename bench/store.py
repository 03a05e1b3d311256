"""The state's save, on a node with 1, 1024 and 4096 claims: it must cost the same on each.

`python -m bench.store [--reps N] [--dir DIR]`: no root, no bus. DIR must be on a tmpfs, as
/run/rdmad is; by default a fresh directory under /dev/shm. Each rep is one claim's way and
its release's, as rdmad.core.core saves them: PENDING (a new file), ACTIVE and RELEASING
(rewrites), ended (the file removed), beside N other claims. Prints each save's p50 and p90
in microseconds; the figures live in docs/performance.md, "In the node's size".
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from dataclasses import replace
from pathlib import Path

from bench.stats import pct
from rdmad.core.store import State, Store
from rdmad.model import Attachment, CharDev, ChardevKind, Claim, ClaimPhase, HostConfig

SIZES = (1, 1024, 4096)
SAVES = ("pending", "active", "releasing", "ended")


def a_claim(n: int) -> Claim:
    return Claim(
        id=f"{n:016x}",
        device=f"mlx5_{n}",
        attachment=Attachment(
            4026532000 + n,
            f"/run/netns/pod{n}",
            n,
            host=HostConfig(n, f"eth{n}", 9000, True, ("10.0.0.1/24",), ""),
            netdev_moved=True,
        ),
        ifname="net0",
        shared=False,
        owner=f"pod{n}",
        created_at_us=n,
        chardevs=(CharDev(ChardevKind.UVERBS, "/dev/infiniband/uverbs0", 231, 192),),
        phase=ClaimPhase.ACTIVE,
    )


def measure(directory: Path, others: int, reps: int) -> dict[str, list[float]]:
    """Microseconds of each save of `reps` claims' and releases' ways beside `others`."""
    store = Store(directory)
    store.load()
    store.save(State([a_claim(n) for n in range(others)]))
    took: dict[str, list[float]] = {save: [] for save in SAVES}
    for rep in range(reps):
        claim = replace(a_claim(others + rep), phase=ClaimPhase.PENDING)
        for save in SAVES:
            if save != "ended":
                claim.phase = ClaimPhase(save)
            started = time.perf_counter_ns()
            store.save_claim(claim, live=save != "ended", pending_restores=[])
            took[save].append((time.perf_counter_ns() - started) / 1000)
    return took


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=500)
    ap.add_argument("--dir", type=Path, help="a directory on a tmpfs (default: under /dev/shm)")
    args = ap.parse_args()
    print("claims  " + "  ".join(f"{save:>17}" for save in SAVES) + "   (us, p50 / p90)")
    for size in SIZES:
        root = Path(tempfile.mkdtemp(prefix="rdmad-bench-store-", dir=args.dir or "/dev/shm"))
        try:
            took = measure(root, size - 1, args.reps)  # the claim saved is the size-th
        finally:
            shutil.rmtree(root)
        cells = [f"{pct(v, 50):8.1f} /{pct(v, 90):7.1f}" for v in took.values()]
        print(f"{size:6d}  " + "  ".join(cells))


if __name__ == "__main__":
    main()
