"""tests/systemd runs only inside the systemd check's guest, where systemd is PID 1 and
rdmad is the installed service (tests/guest/harness/run-systemd-check.sh runs it there with
RDMAD_SYSTEMD_GUEST=1); every other session leaves it out."""

from __future__ import annotations

import os

collect_ignore_glob = [] if os.environ.get("RDMAD_SYSTEMD_GUEST") == "1" else ["test_*.py"]
