"""rdmad.daemon under pyinstrument, profiling only between SIGUSR1 (start) and SIGUSR2 (stop
and save), so a profile covers one workload and not start-up.

    RDMAD_BENCH_PROFILE_DIR=D python -m bench.profiled_daemon <rdmad.daemon arguments>

Each SIGUSR2 writes D/<k>.pyisession and then D/<k>.done (k = 0, 1, ...).
"""

from __future__ import annotations

import itertools
import os
import signal
import sys
from pathlib import Path
from types import FrameType

from pyinstrument import Profiler

from rdmad import daemon

INTERVAL_S = 0.0005


def main() -> int:
    out = Path(os.environ["RDMAD_BENCH_PROFILE_DIR"])
    counter = itertools.count()
    profiler: list[Profiler] = []

    def start(_sig: int, _frame: FrameType | None) -> None:
        # async_mode disabled: sample whatever the event loop thread runs, across tasks
        prof = Profiler(interval=INTERVAL_S, async_mode="disabled")
        prof.start()
        profiler.append(prof)

    def stop(_sig: int, _frame: FrameType | None) -> None:
        if not profiler:
            return
        session = profiler.pop().stop()
        k = next(counter)
        session.save(str(out / f"{k}.pyisession"))
        (out / f"{k}.done").touch()

    signal.signal(signal.SIGUSR1, start)
    signal.signal(signal.SIGUSR2, stop)
    return daemon.main(sys.argv[1:])


if __name__ == "__main__":
    sys.exit(main())
