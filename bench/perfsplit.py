"""A process's CPU time in user space and in the kernel, told apart by sampling with perf.

/proc's utime and stime cannot tell them apart over a short interval: with tick accounting
(CONFIG_TICK_CPU_ACCOUNTING, this machine's) the kernel divides a process's exact runtime
between them by the ratio of its ticks over its whole life (cputime_adjust), so the split of
one operation's CPU follows the process's history, not the operation. perf's cpu-clock
event samples on an hrtimer at PERF_HZ, each sample in user space or in the kernel, whatever
the tick does.

One `perf record` per Sampler, started with its events off; enable() and disable() switch
them through perf's control FIFO and wait for its ack, so only the operations in between
are sampled.
"""

from __future__ import annotations

import os
import select
import signal
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

PERF_HZ = 4999  # prime, so it does not beat with the 250 Hz tick
KERNEL_IPS = 0xFFFF800000000000  # x86-64: the kernel's half of the address space
ACK_TIMEOUT = 10.0


class PerfError(RuntimeError):
    """perf is missing, could not attach, or stopped answering."""


@dataclass(frozen=True)
class Split:
    """Mean CPU per operation, in ms, from perf's samples."""

    user_ms: float
    kernel_ms: float
    user_samples: int


def user_growth(
    large: tuple[Split, Split], small: tuple[Split, Split]
) -> tuple[float, float, float]:
    """How much one column's user CPU grows over another's from one setting to another:
    (a / b) / (c / d) for large (a, b) and small (c, d), with a 95% interval for the sampling
    alone (each count of samples in user space taken as Poisson). Measured beside a
    reference column, the ratio cancels the host's drift in speed between the settings."""
    (a, b), (c, d) = large, small
    ratio = (a.user_ms / b.user_ms) / (c.user_ms / d.user_ms)
    spread = 1.96 * sum(1 / x.user_samples for x in (a, b, c, d)) ** 0.5
    return ratio, ratio * (1 - spread), ratio * (1 + spread)


class Sampler:
    """perf record on process `pid`, off until enable()d (a context manager)."""

    def __init__(self, pid: int) -> None:
        self._dir = Path(tempfile.mkdtemp(prefix="rdmad-perf-"))
        ctl, ack = self._dir / "ctl", self._dir / "ack"
        os.mkfifo(ctl)
        os.mkfifo(ack)
        # O_RDWR on our side as on perf's: neither open waits for the other end
        self._ctl = os.open(ctl, os.O_RDWR)
        self._ack = os.open(ack, os.O_RDWR)
        self._data = self._dir / "perf.data"
        argv = [
            "perf",
            "record",
            "-q",
            "-B",
            "-N",
            "-F",
            str(PERF_HZ),
            "-e",
            "cpu-clock",
            "-D",
            "-1",
        ]
        argv += ["--control", f"fifo:{ctl},{ack}", "-p", str(pid), "-o", str(self._data)]
        try:
            self._perf = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        except FileNotFoundError as e:
            self._cleanup()
            raise PerfError("perf is not installed (Debian: linux-perf)") from e
        self.operations = 0

    def __enter__(self) -> Sampler:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._perf.poll() is None:
            self._perf.kill()
            self._perf.wait()
        self._cleanup()

    def enable(self) -> None:
        """Sample from now on; one more operation is counted."""
        self._command(b"enable")
        self.operations += 1

    def disable(self) -> None:
        self._command(b"disable")

    def split(self) -> Split:
        """Stop perf and read its samples: the mean CPU per enabled operation."""
        self._perf.send_signal(signal.SIGINT)
        _, err = self._perf.communicate(timeout=60)
        if self._perf.returncode not in (0, -signal.SIGINT):  # perf re-raises what stopped it
            raise PerfError(f"perf record exited {self._perf.returncode}: {err.decode()[-500:]}")
        ips = subprocess.run(
            ["perf", "script", "-i", str(self._data), "-F", "ip"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.split()
        if not ips:
            raise PerfError("perf took no samples: the process used no CPU while enabled")
        kernel = sum(1 for ip in ips if int(ip, 16) >= KERNEL_IPS)
        per_op = 1e3 / PERF_HZ / max(self.operations, 1)
        user = len(ips) - kernel
        return Split(user * per_op, kernel * per_op, user)

    def _command(self, what: bytes) -> None:
        os.write(self._ctl, what + b"\n")
        ready, _, _ = select.select([self._ack], [], [], ACK_TIMEOUT)
        if not ready or not os.read(self._ack, 64).startswith(b"ack"):
            raise PerfError(f"perf did not acknowledge {what.decode()!r} within {ACK_TIMEOUT:g} s")

    def _cleanup(self) -> None:
        for fd in (self._ctl, self._ack):
            os.close(fd)
        for f in self._dir.iterdir():
            f.unlink()
        self._dir.rmdir()
