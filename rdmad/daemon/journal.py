"""Logging: structured journal entries under systemd, one-line key=value text elsewhere.

Event records carry the fields of rdmad.core.logfields (written with its `log_event()`); this
module sends them to the journal, or shows them as key=value on stderr.
"""

from __future__ import annotations

import importlib
import logging
import os
import sys
from typing import Any, Final

from rdmad.core.logfields import EVENT_FIELDS

# systemd-python, imported by name: for mypy, the checkout's top-level systemd/ directory
# (unit files) is a namespace package that shadows it; at runtime the real package wins.
_journal: Any = importlib.import_module("systemd.journal")

SYSLOG_IDENTIFIER: Final = "rdmad"


def record_fields(record: logging.LogRecord, message: str) -> dict[str, str]:
    """The journal fields of one record (MESSAGE being the formatted text)."""
    fields = {
        "MESSAGE": message,
        "PRIORITY": str(_journal.JournalHandler.map_priority(record.levelno)),
        "LOGGER": record.name,
        "SYSLOG_IDENTIFIER": SYSLOG_IDENTIFIER,
        "CODE_FILE": record.pathname,
        "CODE_LINE": str(record.lineno),
        "CODE_FUNC": record.funcName,
    }
    message_id = getattr(record, "MESSAGE_ID", None)
    if message_id:
        fields["MESSAGE_ID"] = str(message_id)
    for key in EVENT_FIELDS:
        value = getattr(record, key, None)
        if value is not None:
            fields[key] = str(value)
    if record.exc_text:
        fields["EXCEPTION_TEXT"] = record.exc_text
    return fields


class RdmadJournalHandler(_journal.JournalHandler):  # type: ignore[misc]  # untyped base
    """JournalHandler that sends exactly `record_fields()`.

    The stock emit() forwards every LogRecord attribute; the lowercase ones are dropped by
    journald anyway, this keeps the entry to the fields we document.
    """

    def emit(self, record: logging.LogRecord) -> None:
        try:
            fields = record_fields(record, self.format(record))
            message = fields.pop("MESSAGE")
            # systemd.journal.send() formats CODE_LINE with {:d}: a str raises ValueError
            # and the record is lost (found by tests/guest/harness/run-systemd-check.sh).
            code_line = int(fields.pop("CODE_LINE"))
            self.send(message, CODE_LINE=code_line, **fields)
        except Exception:
            self.handleError(record)


class KeyValueFormatter(logging.Formatter):
    """`LEVEL logger: message device=... netns=... claim=...` (and whichever other
    rdmad.core.logfields fields the record has), one line."""

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s: %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        text = super().format(record)
        head, sep, tail = text.partition("\n")  # keep tracebacks, but after the fields
        head = head.replace("\r", "\\r")
        pairs = [
            f"{short}={_quote(str(getattr(record, key)))}"
            for key, short in EVENT_FIELDS.items()
            if getattr(record, key, None) is not None
        ]
        if pairs:
            head = head + " " + " ".join(pairs)
        return head + sep + tail

    def formatMessage(self, record: logging.LogRecord) -> str:
        # one line per record; a copy, so other handlers still see the original message
        flat = logging.makeLogRecord(record.__dict__)
        flat.message = record.message.replace("\n", "\\n")
        return super().formatMessage(flat)


def _quote(value: str) -> str:
    if value and not any(c.isspace() or c in '"=\\' for c in value):
        return value
    escaped = value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    return f'"{escaped}"'


def stderr_is_journal() -> bool:
    """True when stderr (fd 2) is the stream systemd connected to the journal (JOURNAL_STREAM).

    JOURNAL_STREAM is inherited by children whose stderr may point elsewhere, so it must
    match stderr's device and inode, as sd_journal_stream_fd(3) recommends.
    """
    dev, sep, ino = os.environ.get("JOURNAL_STREAM", "").partition(":")
    if not sep:
        return False
    try:
        st = os.fstat(2)
        return (st.st_dev, st.st_ino) == (int(dev), int(ino))
    except (OSError, ValueError):
        return False


_OURS = "_rdmad_handler"


def setup_logging(level: int | str = logging.INFO) -> logging.Handler:
    """Install rdmad's one handler on the root logger and return it: the journal's when
    stderr is the journal stream, else key=value lines on stderr.

    The rdmad.* loggers get `level`; libraries stay at WARNING so that --log-level debug
    shows rdmad's decisions, not a library's chatter.
    """
    if isinstance(level, str):
        level = logging.getLevelNamesMapping()[level.upper()]
    handler: logging.Handler
    if stderr_is_journal():
        handler = RdmadJournalHandler()
        # journald adds its own timestamp and priority
        handler.setFormatter(logging.Formatter("%(message)s"))
    else:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(KeyValueFormatter())
    setattr(handler, _OURS, True)

    root = logging.getLogger()
    for old in [h for h in root.handlers if getattr(h, _OURS, False)]:
        root.removeHandler(old)
        old.close()
    root.addHandler(handler)
    root.setLevel(logging.WARNING)
    logging.getLogger("rdmad").setLevel(level)
    return handler
