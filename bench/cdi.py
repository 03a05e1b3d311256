"""The CDI rewrite of a claim's pod (rdmad.daemon.cdi), with 1 and with 8 claims in the netns, on a
node with no other claims and on one with 512: it must cost the same on both.

`python -m bench.cdi [--reps N] [--dir DIR]`: no root, no bus. DIR must be on a tmpfs, as
/var/run/cdi is; by default a fresh directory under /dev/shm. Each rep is one claim of the pod
made and ended, as the daemon's CdiWriter is told of them, its pod looked up in the claim
book by netns as Core.pod_of does: "claimed" writes the pod's specs (the new claim's and the
others'), "released" removes the claim's and rewrites the rest. Prints each one's p50 and
p90 in microseconds, and a claim's p50 per spec it writes.
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from pathlib import Path

from bench.stats import pct
from rdmad.core.claims import ClaimBook
from rdmad.daemon.cdi import CdiWriter
from rdmad.model import Attachment, CharDev, ChardevKind, Claim, Gid, ReleaseReason

PODS = (1, 8)
OTHERS = (0, 512)
EVENTS = ("claimed", "released")
POD_NETNS = 4026530000


def a_claim(n: int, netns: int) -> Claim:
    return Claim(
        id=f"{n:016x}",
        device=f"mlx5_{n % 8}",
        attachment=Attachment(
            netns,
            "",
            n,
            gids=(Gid(1, 3, "0000:0000:0000:0000:0000:ffff:0a00:0005", "RoCE v2", "net0"),),
        ),
        ifname=f"net{n % 8}",
        shared=True,
        owner=f"pod{netns}",
        created_at_us=n,
        chardevs=(
            CharDev(ChardevKind.UVERBS, f"/dev/infiniband/uverbs{n % 8}", 231, 192 + n % 8),
            CharDev(ChardevKind.RDMA_CM, "/dev/infiniband/rdma_cm", 10, 58),
        ),
        pod_cdi_name=f"pod{netns}",
    )


def measure(directory: Path, pod: int, others: int, reps: int) -> dict[str, list[float]]:
    """Microseconds of each event of `reps` claims made and ended in a pod of `pod` claims,
    beside `others` claims of other pods (8 a pod)."""
    book = ClaimBook()
    writer = CdiWriter(directory, book.in_netns_of)
    for n in range(others):
        claim = a_claim(n, POD_NETNS + 1 + n // 8)
        book.add(claim)
        writer.claimed(claim)
    for n in range(pod - 1):
        claim = a_claim(others + n, POD_NETNS)
        book.add(claim)
        writer.claimed(claim)
    took: dict[str, list[float]] = {event: [] for event in EVENTS}
    for rep in range(reps):
        claim = a_claim(others + pod + rep, POD_NETNS)
        started = time.perf_counter_ns()
        book.add(claim)
        writer.claimed(claim)
        took["claimed"].append((time.perf_counter_ns() - started) / 1000)
        started = time.perf_counter_ns()
        book.drop(claim)
        writer.released(claim, ReleaseReason.REQUESTED)
        took["released"].append((time.perf_counter_ns() - started) / 1000)
    return took


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=300)
    ap.add_argument("--dir", type=Path, help="a directory on a tmpfs (default: under /dev/shm)")
    args = ap.parse_args()
    print(
        "pod  others  "
        + "  ".join(f"{e:>17}" for e in EVENTS)
        + "   (us, p50 / p90; last: a claim's p50 per spec)"
    )
    for pod in PODS:
        for others in OTHERS:
            root = Path(tempfile.mkdtemp(prefix="rdmad-bench-cdi-", dir=args.dir or "/dev/shm"))
            try:
                took = measure(root, pod, others, args.reps)
            finally:
                shutil.rmtree(root)
            cells = [f"{pct(v, 50):8.1f} /{pct(v, 90):7.1f}" for v in took.values()]
            # a claim writes its pod's specs and its pod CDI name's
            per_spec = pct(took["claimed"], 50) / (pod + 1)
            print(f"{pod:3d}  {others:6d}  " + "  ".join(cells) + f"   {per_spec:6.1f}")


if __name__ == "__main__":
    main()
