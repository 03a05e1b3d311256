"""perf tells a process's CPU in user space from its CPU in the kernel (bench.perfsplit).

Needs root (perf attaching to another process), as the benchmark does."""

from __future__ import annotations

import subprocess
import sys

import pytest

from bench.perfsplit import PerfError, Sampler, Split, user_growth
from tests.support.net import require_root

BUSY_IN_PYTHON = "x = 0\nfor i in range(3_000_000): x += i"
# Into one buffer (os.read's fresh 1 MiB object a read put malloc and free in user space
# beside the kernel's copy), and enough of it to outweigh the interpreter's exit, which is
# sampled too: with 1500 reads by os.read the split came to 3.6x once in CI.
BUSY_IN_THE_KERNEL = (
    "fd = os.open('/dev/zero', os.O_RDONLY)\nbuf = bytearray(1 << 20)\n"
    "for _ in range(6000): os.readv(fd, [buf])"
)


def sampled(work: str) -> Split:
    """Sample a child from before it starts `work` until it exits."""
    require_root()
    child = subprocess.Popen(
        [sys.executable, "-c", f"import os, sys\nsys.stdin.read(1)\n{work}"],
        stdin=subprocess.PIPE,
    )
    assert child.stdin is not None
    try:
        with Sampler(child.pid) as sampler:
            sampler.enable()
            child.stdin.write(b"x")
            child.stdin.close()
            child.wait(timeout=60)
            return sampler.split()
    finally:
        child.kill()
        child.wait()


def test_a_process_busy_in_python_is_sampled_in_user_space() -> None:
    split = sampled(BUSY_IN_PYTHON)
    assert split.user_ms > 4 * split.kernel_ms


def test_a_process_busy_in_system_calls_is_sampled_in_the_kernel() -> None:
    split = sampled(BUSY_IN_THE_KERNEL)
    assert split.kernel_ms > 4 * split.user_ms


def test_user_growth_is_a_ratio_of_ratios_with_an_interval_around_it() -> None:
    large = (Split(4.4, 9.0, 1000), Split(2.0, 8.0, 1000))
    small = (Split(4.0, 2.0, 1000), Split(2.0, 2.0, 1000))
    ratio, low, high = user_growth(large, small)
    assert ratio == pytest.approx(1.1)
    assert high - low == pytest.approx(2 * 1.1 * 1.96 * (4 / 1000) ** 0.5)


def test_a_process_that_used_no_cpu_is_an_error_not_a_zero() -> None:
    require_root()
    child = subprocess.Popen(["sleep", "60"])
    try:
        with Sampler(child.pid) as sampler:
            sampler.enable()
            sampler.disable()
            with pytest.raises(PerfError, match="no samples"):
                sampler.split()
    finally:
        child.kill()
        child.wait()
