"""rdmad with test-only fault injection: `python -m testbed.faulty_rdmad [rdmad options]`.

It installs the faults its environment asks for into rdmad's wiring, then runs rdmad's own
`main`. None of this is in rdmad itself. testbed.daemon.RdmadProcess runs this entry
point instead of `python -m rdmad.daemon.main` whenever its environment has an RDMAD_TEST_*
variable.

  RDMAD_TEST_CRASH_AT=<step>[:<n>]  os._exit(137) the n-th time (default: the first) rdmad logs
                                    <step> (rdmad.core.steps): as abrupt as SIGKILL,
                                    but at a known point between two kernel steps.
  RDMAD_TEST_PAUSE_AT=<step>[:<n>]  SIGSTOP ourselves there instead, so that a test can
                                    change the world mid-claim (delete the netns, fill the
                                    disk) and then SIGCONT us.
  RDMAD_TEST_RCVBUF=<bytes>         receive buffer of the rtnetlink event socket, tiny to
                                    force overruns (ENOBUFS); empty: rdmad's default.
  RDMAD_TEST_UDEV_RCVBUF=<bytes>    the same for the uevent (pyudev) socket.

Steps are counted only from READY=1 on, so the reconciliation at start never trips them: a
test can restart an armed daemon right after a crash and still have it come up.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
from collections.abc import Callable
from typing import Any

import rdmad.daemon.main
import rdmad.daemon.systemd
import rdmad.kernel.udev
from rdmad.kernel.rtnl_events import RtnlEventSource
from testbed.steps import watch_steps

PREFIX = "RDMAD_TEST_"
CRASH_AT, PAUSE_AT = PREFIX + "CRASH_AT", PREFIX + "PAUSE_AT"
RCVBUF, UDEV_RCVBUF = PREFIX + "RCVBUF", PREFIX + "UDEV_RCVBUF"
CRASH_EXIT = 137  # what a shell reports for SIGKILL

log = logging.getLogger("rdmad.test-faults")


class StepFaults:
    """Crash or pause at a named step (rdmad.core.steps), once armed."""

    def __init__(self, points: dict[str, tuple[str, int]]) -> None:
        self._points = points  # action ("crash"/"pause") -> (step, n-th time)
        self._seen: dict[str, int] = {}
        self.armed = False

    def __call__(self, step: str) -> None:
        if not self.armed:
            return
        self._seen[step] = self._seen.get(step, 0) + 1
        for action, (want, count) in self._points.items():
            if step == want and self._seen[step] == count:
                log.warning("TEST %s at step %s (#%d)", action, step, count)
                if action == "crash":
                    os._exit(CRASH_EXIT)
                os.kill(os.getpid(), signal.SIGSTOP)


def _point(spec: str) -> tuple[str, int]:
    step, _, count = spec.partition(":")
    return step, int(count or 1)


def _replace(module: object, name: str, value: object) -> None:
    """Swap one name rdmad's wiring looks up at run time; fail loudly if it has gone, so that
    a renamed constructor cannot quietly turn a fault test into a plain run."""
    if not hasattr(module, name):
        raise SystemExit(f"faulty_rdmad: {module!r} has no {name!r} any more; update the hooks")
    setattr(module, name, value)


def _with_rcvbuf(new_monitor: Callable[[], Any], size: int) -> Callable[[], Any]:
    """rdmad's pyudev monitors, with a receive buffer of `size` bytes instead of libudev's
    128 MiB."""

    def small() -> Any:
        monitor = new_monitor()
        monitor.set_receive_buffer_size(size)  # libudev forces it (SO_RCVBUFFORCE)
        return monitor

    return small


def install(environ: dict[str, str]) -> None:
    unknown = set(k for k in environ if k.startswith(PREFIX)) - {
        CRASH_AT,
        PAUSE_AT,
        RCVBUF,
        UDEV_RCVBUF,
    }
    if unknown:
        raise SystemExit(f"faulty_rdmad: unknown fault variables {sorted(unknown)}")

    if environ.get(RCVBUF):
        _replace(RtnlEventSource, "RCVBUF", int(environ[RCVBUF]))
    if environ.get(UDEV_RCVBUF):
        new_monitor = _with_rcvbuf(rdmad.kernel.udev.new_monitor, int(environ[UDEV_RCVBUF]))
        _replace(rdmad.kernel.udev, "new_monitor", new_monitor)

    points = {
        action: _point(environ[var])
        for action, var in (("crash", CRASH_AT), ("pause", PAUSE_AT))
        if environ.get(var)
    }
    if not points:
        return
    faults = StepFaults(points)
    watch_steps(faults)
    notify_ready = rdmad.daemon.systemd.notify_ready

    def arm_then_notify_ready(status: str | None = None) -> bool:
        faults.armed = True
        return notify_ready(status)

    _replace(rdmad.daemon.systemd, "notify_ready", arm_then_notify_ready)
    log.warning("TEST fault injection installed: %s", points)


if __name__ == "__main__":
    install(dict(os.environ))
    sys.exit(rdmad.daemon.main.main(sys.argv[1:]))
