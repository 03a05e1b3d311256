"""rdmactl's exit statuses, each with what it means and what rdmactl prints on stderr: the one
table of them. `rdmactl --help` ends with it; docs/dbus-api.md's "Exit status" table is
checked against it (tests/cli/test_rdmactl_docs.py)."""

from __future__ import annotations

import textwrap
from dataclasses import dataclass
from enum import IntEnum


class Exit(IntEnum):
    OK = 0
    REFUSED = 1
    USAGE = 2  # argparse's own
    UNREACHABLE = 3
    OUTPUT = 74  # sysexits.h's EX_IOERR
    INTERRUPTED = 130  # 128 + SIGINT, as shells report it
    BROKEN_PIPE = 141  # 128 + SIGPIPE, as for a tool that signal killed


@dataclass(frozen=True)
class Meaning:
    text: str
    stderr: str = ""  # the line rdmactl prints, in its shape; "" for nothing


MEANINGS: dict[Exit, Meaning] = {
    Exit.OK: Meaning("done"),
    Exit.REFUSED: Meaning(
        "rdmad refused (no such device or claim, busy, bad netns, not allowed, ...)",
        "rdmactl: ERROR-NAME: MESSAGE",
    ),
    Exit.USAGE: Meaning(
        "usage error: an unknown command or option, a missing or malformed argument, "
        "a bus address that is not a D-Bus address",
        "usage: ... and rdmactl COMMAND: error: ...",
    ),
    Exit.UNREACHABLE: Meaning(
        "rdmad unreachable: no bus, rdmad not running, or no answer within --timeout",
        "rdmactl: daemon unreachable: bus ADDRESS: REASON (hint: ...)",
    ),
    Exit.OUTPUT: Meaning(
        "the output could not be written (a full disk)",
        "rdmactl: cannot write the output: REASON",
    ),
    Exit.INTERRUPTED: Meaning(
        "interrupted by Ctrl-C (monitor and stats --watch end with 0: it is how they stop)"
    ),
    Exit.BROKEN_PIPE: Meaning("the reader of the output went away (rdmactl monitor | head -n 1)"),
}


def help_text(width: int = 79) -> str:
    """The table as `rdmactl --help` ends with it: each status, its meaning, and the line it
    prints on stderr."""
    lines = ["exit status:"]
    for status in Exit:
        meaning = MEANINGS[status]
        lines += textwrap.wrap(
            meaning.text, width, initial_indent=f"  {status:<5}", subsequent_indent=" " * 7
        )
        if meaning.stderr:
            lines.append(f"       stderr: {meaning.stderr}")
    return "\n".join(lines)
