"""How much of an operation is the kernel's netns move: ftrace syscall events, per operation.

A netns move waits for RCU inside send() (sendto for pyroute2 and rdmad, sendmsg for ip),
and on these hosts that wait comes in whole scheduler ticks (4 ms at HZ=250): one move
takes 12, 16, 20 or 28 ms depending on where the tick falls. That dominates every column
of the claim/release table and makes the p50 of a few hundred samples jump between modes.
Subtracting each operation's own move (the longest send syscall between its start and end
markers, whichever process or thread made it) leaves what each tool itself costs, which is
what a tool can change.

Needs root and tracefs; `MoveTrace.open()` returns None where either is missing, and the
report then says the split was not measured.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

TRACEFS = Path("/sys/kernel/tracing")
_EVENTS = ("sys_enter_sendto", "sys_exit_sendto", "sys_enter_sendmsg", "sys_exit_sendmsg")
_LINE = re.compile(r"\s*.+?-(\d+)\s+\[\d+\]\s+\S+\s+([\d.]+): (.*)")
_MARK = "tracing_mark_write: "


class MoveTrace:
    """Mark operations with `begin`/`end`; `moves()` maps each label to its longest send."""

    def __init__(self) -> None:
        self._marker = -1

    @classmethod
    def open(cls) -> MoveTrace | None:
        if not (TRACEFS / "trace_marker").exists() or not os.access(TRACEFS, os.W_OK):
            return None
        trace = cls()
        try:
            trace._start()
        except OSError:
            trace.close()
            return None
        return trace

    def _write(self, name: str, value: str) -> None:
        (TRACEFS / name).write_text(value)

    def _start(self) -> None:
        self._write("tracing_on", "0")
        self._write("trace", "")
        self._write("buffer_size_kb", "16384")
        for ev in _EVENTS:
            self._write(f"events/syscalls/{ev}/enable", "1")
        self._write("tracing_on", "1")
        self._marker = os.open(TRACEFS / "trace_marker", os.O_WRONLY | os.O_CLOEXEC)

    def begin(self, label: str) -> None:
        os.write(self._marker, f"B {label}".encode())

    def end(self, label: str) -> None:
        os.write(self._marker, f"E {label}".encode())

    def close(self) -> None:
        if self._marker >= 0:
            os.close(self._marker)
            self._marker = -1
        try:
            self._write("tracing_on", "0")
            for ev in _EVENTS:
                self._write(f"events/syscalls/{ev}/enable", "0")
        except OSError:
            pass

    def moves(self) -> dict[str, float]:
        """Label -> the longest send syscall (ms) inside that operation. Call after close()."""
        return longest_sends((TRACEFS / "trace").read_text().splitlines())


def longest_sends(lines: list[str]) -> dict[str, float]:
    out: dict[str, float] = {}
    current: str | None = None
    entered: dict[str, float] = {}  # pid -> timestamp of its pending sys_enter
    for line in lines:
        m = _LINE.match(line)
        if m is None:
            continue
        pid, ts, rest = m.group(1), float(m.group(2)), m.group(3)
        if rest.startswith(_MARK):
            tag, _, label = rest[len(_MARK) :].partition(" ")
            current = label if tag == "B" else None
            continue
        if current is None or not rest.startswith("sys_send"):
            continue
        if "->" in rest:  # sys_sendto -> 0x34
            t0 = entered.pop(pid, None)
            if t0 is not None:
                out[current] = max(out.get(current, 0.0), (ts - t0) * 1000.0)
        else:
            entered[pid] = ts
    return out
