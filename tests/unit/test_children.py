"""testbed.children: a child starts with the default signal dispositions and no signal
blocked, even when the test run ignores or blocks some (as under a script's `make test &`)."""

from __future__ import annotations

import asyncio
import signal
import subprocess
from collections.abc import Iterator

import pytest

from testbed.children import UNCATCHABLE, popen, spawn

STATUS = ["grep", "-E", "^Sig(Ign|Blk):", "/proc/self/status"]
# Every signal a process can set: not SIGKILL and SIGSTOP, nor the C library's own (32, 33),
# which make, for one, starts its commands with ignored.
SETTABLE = sum(1 << (sig - 1) for sig in signal.valid_signals() - UNCATCHABLE)


@pytest.fixture
def run_ignoring_and_blocking_signals() -> Iterator[None]:
    """This process as a background job of a script starts: SIGINT and SIGQUIT ignored; and
    SIGUSR1 blocked."""
    before = {sig: signal.signal(sig, signal.SIG_IGN) for sig in (signal.SIGINT, signal.SIGQUIT)}
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR1})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGUSR1})
        for sig, handler in before.items():
            signal.signal(sig, handler)


def masks(status: bytes) -> dict[str, int]:
    """{"SigIgn": mask, "SigBlk": mask} of the settable signals, from /proc/PID/status lines."""
    pairs = (line.split(":") for line in status.decode().splitlines())
    return {name: int(value, 16) & SETTABLE for name, value in pairs}


def test_the_fixture_makes_a_plain_child_inherit_what_the_helpers_undo(
    run_ignoring_and_blocking_signals: None,
) -> None:
    seen = masks(subprocess.run(STATUS, capture_output=True, check=True).stdout)
    assert seen["SigIgn"] & 1 << (signal.SIGINT - 1)
    assert seen["SigBlk"] & 1 << (signal.SIGUSR1 - 1)


def test_popen_starts_a_child_with_no_signal_ignored_or_blocked(
    run_ignoring_and_blocking_signals: None,
) -> None:
    child = popen(STATUS, stdout=subprocess.PIPE)
    out, _ = child.communicate(timeout=10)
    assert masks(out) == {"SigIgn": 0, "SigBlk": 0}


async def test_spawn_starts_a_child_with_no_signal_ignored_or_blocked(
    run_ignoring_and_blocking_signals: None,
) -> None:
    child = await spawn(*STATUS, stdout=asyncio.subprocess.PIPE)
    out, _ = await asyncio.wait_for(child.communicate(), 10)
    assert masks(out) == {"SigIgn": 0, "SigBlk": 0}
