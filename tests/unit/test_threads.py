"""A process's threads as the kernel sees them (testbed/threads.py: kernel_report)."""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator

import pytest

from testbed.threads import kernel_report


@pytest.fixture
def thread_on_a_pipe() -> Iterator[int]:
    """A thread of this process reading an empty pipe; its kernel thread id."""
    r, w = os.pipe()
    thread = threading.Thread(target=os.read, args=(r, 1))
    thread.start()
    assert thread.native_id is not None
    try:
        yield thread.native_id
    finally:
        os.write(w, b"x")
        thread.join()
        os.close(r)
        os.close(w)


def thread_lines(pid: int) -> dict[str, list[str]]:
    """kernel_report's thread lines, by thread id: [state, wait channel]."""
    lines = [line.split() for line in kernel_report(pid) if line.startswith("thread ")]
    return {tid: rest for _, tid, *rest in lines}


def test_every_thread_of_a_process_is_listed(thread_on_a_pipe: int) -> None:
    listed = thread_lines(os.getpid())
    assert {str(threading.get_native_id()), str(thread_on_a_pipe)} <= set(listed)


def test_a_thread_reading_the_report_is_listed_running() -> None:
    assert thread_lines(os.getpid())[str(threading.get_native_id())][0] == "R"


def test_a_process_that_is_gone_has_no_threads() -> None:
    assert kernel_report(2**22 + 1) == []  # above pid_max's ceiling: never a live pid
