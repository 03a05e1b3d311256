"""Debian's polkitd (/usr/lib/polkit-1/polkitd) on a private system bus, with rdmad's
shipped actions and the caller's rules (the tests', the benchmark's).

polkitd reads actions only from /usr/share/polkit-1/actions and rules only from
/etc/polkit-1/rules.d and /usr/share/polkit-1/rules.d (compiled in: no option points it
elsewhere), so `start_polkitd` writes rdmad's action file and the test's rules file there
and puts back what was there before when it stops. It takes the system bus from
DBUS_SYSTEM_BUS_ADDRESS and needs no systemd or logind for rules on users and groups.

Without polkitd the fixtures skip, except when CI=true: then they fail.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from testbed.bus import REPO, PrivateBus
from testbed.children import popen

POLKITD = Path("/usr/lib/polkit-1/polkitd")
POLKIT_NAME = "org.freedesktop.PolicyKit1"
SHIPPED_ACTIONS = REPO / "polkit" / "io.rdmad1.policy"
ACTIONS = Path("/usr/share/polkit-1/actions") / SHIPPED_ACTIONS.name
RULES_FILE = Path("/etc/polkit-1/rules.d/50-rdmad-tests.rules")
START_TIMEOUT = 10


@contextmanager
def _written(path: Path, text: str) -> Iterator[None]:
    """`path` holds `text` meanwhile; what it held before (or its absence) comes back."""
    before = path.read_text() if path.exists() else None
    path.write_text(text)
    try:
        yield
    finally:
        if before is None:
            path.unlink(missing_ok=True)
        else:
            path.write_text(before)


def require_polkitd() -> None:
    """Skip without polkitd; fail under CI=true."""
    if POLKITD.exists():
        return
    reason = f"{POLKITD} is not installed (Debian's polkitd)"
    if os.environ.get("CI") == "true":
        pytest.fail(f"polkitd is required in CI: {reason}")
    pytest.skip(reason)


@contextmanager
def start_polkitd(bus: PrivateBus, rules: str) -> Iterator[subprocess.Popen[bytes]]:
    """polkitd on `bus` with rdmad's actions and `rules` (JavaScript), ready (its name is
    on the bus) when this yields; stopped, and its files removed, on exit."""
    require_polkitd()
    env = {"DBUS_SYSTEM_BUS_ADDRESS": bus.address, "PATH": "/usr/bin:/bin"}
    log = bus.directory / "polkitd.log"
    with _written(ACTIONS, SHIPPED_ACTIONS.read_text()), _written(RULES_FILE, rules):
        with log.open("wb") as out:
            proc = popen([str(POLKITD), "--no-debug"], env=env, stdout=out, stderr=out)
        try:
            waited = subprocess.run(
                ["gdbus", "wait", "--system", "--timeout", str(START_TIMEOUT), POLKIT_NAME],
                env=env,
                capture_output=True,
                check=False,
            )
            assert waited.returncode == 0, f"polkitd did not start: {log.read_text()}"
            yield proc
        finally:
            proc.kill()
            proc.wait()
