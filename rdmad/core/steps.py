"""How far a claim or release got: one DEBUG record per finished kernel step.

A claim or a release is a series of kernel steps with state saves between some of them; a
crash between two leaves what the next start reconciles (docs/reliability.md). Each step is
logged on the `rdmad.core.steps` logger with its name in the RDMAD_STEP field, so that at
`--log-level debug` an operator sees the last step an interrupted operation finished, and
the crash-point tests stop the daemon at a step they name.
"""

from __future__ import annotations

import logging

log = logging.getLogger("rdmad.core.steps")


def step(name: str, subject: str) -> None:
    """Record that step `name` of the operation on `subject` (a claim, a netdev) is done."""
    if log.isEnabledFor(logging.DEBUG):
        log.debug("%s: %s", subject, name, extra={"RDMAD_STEP": name}, stacklevel=2)
