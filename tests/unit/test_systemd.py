"""sd_notify over a real AF_UNIX datagram socket, and the watchdog task."""

from __future__ import annotations

import asyncio
import os
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from rdmad.daemon import systemd

WAIT = 10.0  # upper bound for anything to arrive; normally instantaneous


@pytest.fixture
def notify_sock(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[socket.socket]:
    path = tmp_path / "notify"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
    sock.bind(str(path))
    sock.settimeout(WAIT)
    monkeypatch.setenv("NOTIFY_SOCKET", str(path))
    for var in ("WATCHDOG_USEC", "WATCHDOG_PID"):
        monkeypatch.delenv(var, raising=False)
    yield sock
    sock.close()


def test_ready_with_status(notify_sock: socket.socket) -> None:
    assert systemd.notify_ready("serving 2 devices\nand more")
    assert notify_sock.recv(4096) == b"READY=1\nSTATUS=serving 2 devices and more"


def test_stopping_and_watchdog(notify_sock: socket.socket) -> None:
    assert systemd.notify_stopping()
    assert notify_sock.recv(4096) == b"STOPPING=1"
    assert systemd.notify_watchdog()
    assert notify_sock.recv(4096) == b"WATCHDOG=1"


def test_abstract_socket(monkeypatch: pytest.MonkeyPatch) -> None:
    name = f"rdmad-test-notify-{os.getpid()}"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind("\0" + name)
        sock.settimeout(WAIT)
        monkeypatch.setenv("NOTIFY_SOCKET", "@" + name)
        assert systemd.notify_ready()
        assert sock.recv(4096) == b"READY=1"


def test_no_notify_socket_is_a_noop(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NOTIFY_SOCKET", raising=False)
    assert systemd.notify_ready("x") is False
    assert systemd.notify_watchdog() is False


def test_vanished_socket_does_not_raise(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NOTIFY_SOCKET", str(tmp_path / "gone"))
    assert systemd.notify_ready() is False


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({}, None),
        ({"WATCHDOG_USEC": "30000000"}, 15.0),
        ({"WATCHDOG_USEC": "0"}, None),
        ({"WATCHDOG_USEC": "junk"}, None),
        ({"WATCHDOG_USEC": "2000000", "WATCHDOG_PID": str(os.getpid())}, 1.0),
        ({"WATCHDOG_USEC": "2000000", "WATCHDOG_PID": str(os.getpid() + 1)}, None),
        ({"WATCHDOG_USEC": "2000000", "WATCHDOG_PID": "junk"}, None),
    ],
)
def test_watchdog_interval(
    env: dict[str, str], expected: float | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    for var in ("WATCHDOG_USEC", "WATCHDOG_PID"):
        monkeypatch.delenv(var, raising=False)
    for var, value in env.items():
        monkeypatch.setenv(var, value)
    assert systemd.watchdog_interval() == expected


async def test_no_watchdog_task_without_watchdog_usec(notify_sock: socket.socket) -> None:
    assert systemd.start_watchdog() is None


async def test_no_watchdog_task_for_another_pid(
    notify_sock: socket.socket, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("WATCHDOG_USEC", "100000")
    monkeypatch.setenv("WATCHDOG_PID", "1")
    assert systemd.start_watchdog() is None


async def test_watchdog_pings_until_cancelled(
    notify_sock: socket.socket, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("WATCHDOG_USEC", "100000")  # ping every 50 ms
    monkeypatch.setenv("WATCHDOG_PID", str(os.getpid()))
    notify_sock.setblocking(False)
    loop = asyncio.get_running_loop()
    task = systemd.start_watchdog()
    assert task is not None
    try:
        for _ in range(3):  # the first ping is immediate, then one per interval
            msg = await asyncio.wait_for(loop.sock_recv(notify_sock, 4096), WAIT)
            assert msg == b"WATCHDOG=1"
    finally:
        await systemd.stop_watchdog(task)
    assert task.cancelled()
