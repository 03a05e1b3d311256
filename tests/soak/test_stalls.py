"""The soak's view of a process's threads in the kernel (tests/soak/stalls.py)."""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator

import pytest

from tests.soak.stalls import kernel_threads


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


def test_every_thread_of_a_process_is_listed_with_its_state(thread_on_a_pipe: int) -> None:
    listed = [line.split()[1] for line in kernel_threads(os.getpid()) if line.startswith("thread")]
    assert {str(threading.get_native_id()), str(thread_on_a_pipe)} <= set(listed)


def test_a_process_that_is_gone_has_no_threads() -> None:
    assert kernel_threads(2**22 + 1) == []  # above pid_max's ceiling: never a live pid
