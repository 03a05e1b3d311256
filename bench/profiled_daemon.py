"""rdmad.daemon.main under a profiler, profiling only between SIGUSR1 (start) and SIGUSR2 (stop
and save), so a profile covers one workload and not start-up.

    RDMAD_BENCH_PROFILE_DIR=D python -m bench.profiled_daemon <rdmad.daemon.main arguments>

Each SIGUSR2 writes D/<k>.pyisession (pyinstrument: wall samples of the loop thread) or,
with RDMAD_BENCH_PROFILER=cprofile, D/<k>.pstats (cProfile: every call, timed by the
thread's CPU clock, so a loaded host's preemption is not counted), then D/<k>.done
(k = 0, 1, ...).
"""

from __future__ import annotations

import cProfile
import itertools
import os
import signal
import sys
import time
from pathlib import Path
from types import FrameType

from pyinstrument import Profiler

from rdmad.daemon import main as daemon

INTERVAL_S = 0.0005


def main() -> int:
    out = Path(os.environ["RDMAD_BENCH_PROFILE_DIR"])
    deterministic = os.environ.get("RDMAD_BENCH_PROFILER") == "cprofile"
    counter = itertools.count()
    running: list[Profiler | cProfile.Profile] = []

    def start(_sig: int, _frame: FrameType | None) -> None:
        if deterministic:
            calls = cProfile.Profile(time.thread_time)
            calls.enable()
            running.append(calls)
        else:
            # async_mode disabled: sample whatever the event loop thread runs, across tasks
            sampler = Profiler(interval=INTERVAL_S, async_mode="disabled")
            sampler.start()
            running.append(sampler)

    def stop(_sig: int, _frame: FrameType | None) -> None:
        if not running:
            return
        prof = running.pop()
        k = next(counter)
        if isinstance(prof, cProfile.Profile):
            prof.disable()
            prof.dump_stats(str(out / f"{k}.pstats"))
        else:
            prof.stop().save(str(out / f"{k}.pyisession"))
        (out / f"{k}.done").touch()

    signal.signal(signal.SIGUSR1, start)
    signal.signal(signal.SIGUSR2, stop)
    return daemon.main(sys.argv[1:])


if __name__ == "__main__":
    sys.exit(main())
