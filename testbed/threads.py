"""A process's threads, how often each woke and where each sleeps, from /proc/<pid>/task:
what rdmad-dra's idle test and its benchmark (bench/dra.py) count, and what the soak's
violation report shows of rdmad (tests/soak/runner.py)."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import NamedTuple

# The threads gRPC's C core starts and names (comm is cut to 15 bytes): its EventEngine's
# work-stealing pool and that pool's lifeguard, and iomgr's timer manager. grpc.aio's
# completion-queue poller is a Python thread, named `python` as the others.
GRPC_CORE_THREADS = frozenset({"event_engine", "lifeguard", "grpc_global_tim"})
STACK_FRAMES = 8  # of each thread's kernel stack in kernel_report()


class Thread(NamedTuple):
    name: str  # comm
    tid: int


def switches(pid: int) -> dict[Thread, int]:
    """Voluntary + nonvoluntary context switches of each live thread of `pid`: a sleeping
    thread adds one each time it wakes."""
    out = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(FileNotFoundError):  # a thread that ended meanwhile
            name = (task / "comm").read_text().strip()
            status = (task / "status").read_text().splitlines()
            out[Thread(name, int(task.name))] = sum(
                int(line.split()[1])
                for line in status
                if line.startswith(("voluntary_ctxt_switches:", "nonvoluntary_ctxt_switches:"))
            )
    return out


def woken(before: dict[Thread, int], after: dict[Thread, int]) -> dict[Thread, int]:
    """The threads that switched between two switches() readings, and how often; a thread
    born meanwhile counts all its switches."""
    out = {t: n - before.get(t, 0) for t, n in after.items()}
    return {t: n for t, n in sorted(out.items()) if n}


def polling(pid: int) -> set[int]:
    """The threads of `pid` asleep in epoll_wait (an asyncio loop, grpc.aio's poller, the
    EventEngine's poller), by the kernel function each sleeps in."""
    out = set()
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(FileNotFoundError):
            if "epoll" in (task / "wchan").read_text():
                out.add(int(task.name))
    return out


def kernel_report(pid: int) -> list[str]:
    """One line per live thread of `pid` (its id, state and kernel wait channel), each
    followed by the top of its kernel stack (only root reads it); [] once `pid` is gone."""
    out = []
    with contextlib.suppress(FileNotFoundError):
        for task in sorted(Path(f"/proc/{pid}/task").iterdir(), key=lambda t: int(t.name)):
            try:
                state = (task / "stat").read_text().rsplit(") ", 1)[1].split()[0]
                wchan = (task / "wchan").read_text() or "-"
            except (FileNotFoundError, ProcessLookupError):
                continue  # a thread that ended meanwhile
            try:
                stack = (task / "stack").read_text().splitlines()
            except (FileNotFoundError, ProcessLookupError, PermissionError):
                stack = []  # ended meanwhile, or we are not root
            out.append(f"thread {task.name} {state} {wchan}")
            out += [f"    {frame.split('] ', 1)[-1]}" for frame in stack[:STACK_FRAMES]]
    return out
