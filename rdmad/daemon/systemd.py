"""sd_notify and the systemd watchdog.

All of it is a no-op outside systemd: without NOTIFY_SOCKET nothing is sent, and without
WATCHDOG_USEC no watchdog task exists at all (an idle daemon must not wake up).
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import logging
import os
from typing import Any

# systemd-python, imported by name: for mypy, the checkout's top-level systemd/ directory
# (unit files) is a namespace package that shadows it; at runtime the real package wins.
_sd: Any = importlib.import_module("systemd.daemon")

log = logging.getLogger(__name__)


def notify(*assignments: str) -> bool:
    """Send "KEY=value" assignments in one datagram; False when not under systemd."""
    if not os.environ.get("NOTIFY_SOCKET"):
        return False
    # libsystemd's sd_notify: handles path and abstract ("@...") sockets and credentials.
    try:
        return bool(_sd.notify("\n".join(assignments)))
    except OSError as exc:  # a vanished socket must not take the daemon down
        log.warning("sd_notify failed: %s", exc)
        return False


def _status(text: str | None) -> list[str]:
    # STATUS is one line in `systemctl status`; a newline would start a new assignment.
    return [] if text is None else ["STATUS=" + " ".join(text.splitlines())]


def notify_ready(status: str | None = None) -> bool:
    """READY=1: state is loaded and the bus name is taken (Type=notify start completes)."""
    return notify("READY=1", *_status(status))


def notify_stopping(status: str | None = None) -> bool:
    return notify("STOPPING=1", *_status(status))


def notify_watchdog() -> bool:
    return notify("WATCHDOG=1")


def watchdog_interval() -> float | None:
    """Seconds between WATCHDOG=1 pings (half of WATCHDOG_USEC), or None if not asked for.

    WATCHDOG_PID, when set, names the process systemd watches: a child that inherited the
    environment must not ping on its parent's behalf.
    """
    try:
        usec = int(os.environ.get("WATCHDOG_USEC", ""))
    except ValueError:
        return None
    if usec <= 0:
        return None
    pid = os.environ.get("WATCHDOG_PID")
    if pid:
        try:
            if int(pid) != os.getpid():
                return None
        except ValueError:
            return None
    return usec / 2 / 1_000_000


async def _watchdog_loop(interval: float) -> None:
    # The ping comes from the event loop itself: if the loop is blocked or wedged, the pings
    # stop and systemd restarts us. A timer, not a poll of any state.
    while True:
        notify_watchdog()
        await asyncio.sleep(interval)


def start_watchdog() -> asyncio.Task[None] | None:
    """Start pinging the watchdog on the running loop; None when systemd asked for none.

    Cancel the returned task on shutdown.
    """
    interval = watchdog_interval()
    if interval is None or not os.environ.get("NOTIFY_SOCKET"):
        return None
    log.debug("systemd watchdog: ping every %.3f s", interval)
    return asyncio.get_running_loop().create_task(_watchdog_loop(interval), name="sd-watchdog")


async def stop_watchdog(task: asyncio.Task[None] | None) -> None:
    """Cancel a task from start_watchdog() and wait for it to finish."""
    if task is None:
        return
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
