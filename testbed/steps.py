"""Acting at a named kernel step of a claim or release: rdmad logs each finished step on
the `rdmad.core.steps` logger (rdmad.core.steps); a handler there sees them as they happen, in the
thread that made the step."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator

from rdmad.core.steps import log as steps_log

StepCallback = Callable[[str], None]


class _StepHandler(logging.Handler):
    def __init__(self, callback: StepCallback) -> None:
        super().__init__(logging.DEBUG)
        self._callback = callback

    def emit(self, record: logging.LogRecord) -> None:
        # Handler.handle() lets an exception from here reach the step's caller: a failing
        # callback fails the step.
        self._callback(str(record.__dict__["RDMAD_STEP"]))


def watch_steps(callback: StepCallback) -> logging.Handler:
    """From now on, call `callback` with each step's name; the handler doing it."""
    handler = _StepHandler(callback)
    steps_log.setLevel(logging.DEBUG)
    steps_log.addHandler(handler)
    return handler


@contextlib.contextmanager
def on_steps(callback: StepCallback) -> Iterator[None]:
    """Call `callback` with each step's name while the block runs."""
    level = steps_log.level
    handler = watch_steps(callback)
    try:
        yield
    finally:
        steps_log.removeHandler(handler)
        steps_log.setLevel(level)
