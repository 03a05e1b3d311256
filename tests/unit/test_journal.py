"""Log records → journal fields, and the key=value stderr format."""

from __future__ import annotations

import importlib
import io
import logging
import os
import re
import sys
import uuid
from collections.abc import Iterator

import pytest

from rdmad.core import logfields
from rdmad.daemon import journal

IDS = {name: value for name, value in vars(logfields).items() if name.startswith("MESSAGE_")}


@pytest.fixture
def logger() -> Iterator[logging.Logger]:
    log = logging.getLogger("rdmad.test_journal")
    yield log
    root = logging.getLogger()
    for h in [h for h in root.handlers if getattr(h, "_rdmad_handler", False)]:
        root.removeHandler(h)


def stderr_journal_stream() -> str:
    """JOURNAL_STREAM as systemd sets it when stderr (fd 2) is the journal's stream."""
    st = os.fstat(2)
    return f"{st.st_dev}:{st.st_ino}"


def stderr_logging(level: str, monkeypatch: pytest.MonkeyPatch) -> io.StringIO:
    """rdmad's stderr logging (not under systemd) at `level`, written to the returned buffer."""
    monkeypatch.delenv("JOURNAL_STREAM", raising=False)
    out = io.StringIO()
    monkeypatch.setattr(sys, "stderr", out)
    journal.setup_logging(level)
    return out


def journal_logging(level: str, monkeypatch: pytest.MonkeyPatch) -> logging.Handler:
    """rdmad's logging with stderr connected to the journal, as under systemd."""
    monkeypatch.setenv("JOURNAL_STREAM", stderr_journal_stream())
    return journal.setup_logging(level)


def journal_entries(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, str]]:
    """What reaches the journal socket, entry by entry: systemd-python's own send() runs,
    only its socket write (sendv) is replaced."""
    entries: list[dict[str, str]] = []

    def sendv(*args: str) -> None:
        entries.append(dict(a.split("=", 1) for a in args))

    monkeypatch.setattr(importlib.import_module("systemd.journal"), "sendv", sendv)
    return entries


def test_message_ids_are_fixed_distinct_uuids() -> None:
    assert set(IDS) == {
        "MESSAGE_CLAIMED",
        "MESSAGE_RELEASED",
        "MESSAGE_DEVICE_ADDED",
        "MESSAGE_DEVICE_REMOVED",
        "MESSAGE_NETNS_GONE",
        "MESSAGE_RELEASED_DEVICE_REMOVED",
        "MESSAGE_MODE_CHANGED",
        "MESSAGE_RECONCILED",
        "MESSAGE_GIDS_CHANGED",
        "MESSAGE_RESYNC",
        "MESSAGE_CLAIM_FAILED",
        "MESSAGE_INTERRUPTED",
        "MESSAGE_NOT_RETURNED",
        "MESSAGE_GIDS_UNREADABLE",
        "MESSAGE_NETDEV_UNREADABLE",
        "MESSAGE_NSID_REUSED",
        "MESSAGE_JOB_FAILED",
        "MESSAGE_START",
        "MESSAGE_STOP",
    }
    assert len(set(IDS.values())) == len(IDS)
    for value in IDS.values():
        assert uuid.UUID(hex=value).hex == value  # 128-bit, lowercase, no dashes
    assert logfields.MESSAGE_CLAIMED == "ff8eafd40d364c19a34673bc3b1e4b38"  # never changes


def test_stderr_line_shows_fields(logger: logging.Logger, monkeypatch: pytest.MonkeyPatch) -> None:
    out = stderr_logging("info", monkeypatch)
    logfields.log_event(
        logger,
        logfields.MESSAGE_CLAIMED,
        "rxe0 claimed into /run/netns/c 100%",
        device="rxe0",
        netns="/run/netns/c",
        claim="c1",
    )
    line = out.getvalue()
    assert line.count("\n") == 1
    assert line.rstrip("\n").endswith(
        "INFO rdmad.test_journal: rxe0 claimed into /run/netns/c 100% "
        "device=rxe0 netns=/run/netns/c claim=c1"
    )
    assert "reason=" not in line


def test_stderr_quotes_and_flattens(
    logger: logging.Logger, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = stderr_logging("debug", monkeypatch)
    logfields.log_event(
        logger, logfields.MESSAGE_RELEASED, "two\nlines", netns='a b"c', reason="netns-gone"
    )
    assert out.getvalue().endswith('two\\nlines netns="a b\\"c" reason=netns-gone\n')


def test_levels(logger: logging.Logger, monkeypatch: pytest.MonkeyPatch) -> None:
    out = stderr_logging("warning", monkeypatch)
    logger.info("hidden")
    logging.getLogger("dbus_fast").info("library noise")
    logger.warning("shown")
    assert "hidden" not in out.getvalue()
    assert "noise" not in out.getvalue()
    assert "WARNING rdmad.test_journal: shown" in out.getvalue()


def test_setup_replaces_its_own_handler(
    logger: logging.Logger, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("JOURNAL_STREAM", raising=False)
    first = journal.setup_logging("info")
    second = journal.setup_logging("info")
    handlers = logging.getLogger().handlers
    assert second in handlers
    assert first not in handlers


def test_record_fields_mapping(logger: logging.Logger) -> None:
    record = logger.makeRecord(
        logger.name,
        logging.ERROR,
        "/x/core.py",
        42,
        "%s",
        ("gone",),
        None,
        func="release",
        extra={
            "MESSAGE_ID": logfields.MESSAGE_NETNS_GONE,
            "RDMAD_DEVICE": "mlx5_0",
            "RDMAD_NETNS": "/proc/7/ns/net",
            "RDMAD_CLAIM": "c9",
            "RDMAD_REASON": "netns-gone",
        },
    )
    assert journal.record_fields(record, "gone") == {
        "MESSAGE": "gone",
        "MESSAGE_ID": logfields.MESSAGE_NETNS_GONE,
        "PRIORITY": "3",
        "LOGGER": "rdmad.test_journal",
        "SYSLOG_IDENTIFIER": "rdmad",
        "CODE_FILE": "/x/core.py",
        "CODE_LINE": "42",
        "CODE_FUNC": "release",
        "RDMAD_DEVICE": "mlx5_0",
        "RDMAD_NETNS": "/proc/7/ns/net",
        "RDMAD_CLAIM": "c9",
        "RDMAD_REASON": "netns-gone",
    }


def test_journal_handler_sends_fields(
    logger: logging.Logger, monkeypatch: pytest.MonkeyPatch
) -> None:
    sent = journal_entries(monkeypatch)
    handler = journal_logging("info", monkeypatch)
    assert isinstance(handler, journal.RdmadJournalHandler)
    logfields.log_event(logger, logfields.MESSAGE_START, "rdmad ready")
    logfields.log_event(
        logger, logfields.MESSAGE_DEVICE_ADDED, "rxe0 appeared", device="rxe0", level=logging.DEBUG
    )  # below the level: not sent
    logger.warning("plain %s", "warning")
    assert len(sent) == 2
    start, plain = sent
    assert start["MESSAGE"] == "rdmad ready"
    assert start["MESSAGE_ID"] == logfields.MESSAGE_START
    assert start["PRIORITY"] == "6"
    assert not any(k.startswith("RDMAD_") for k in start)
    assert plain["MESSAGE"] == "plain warning"
    assert plain["PRIORITY"] == "4"
    assert "MESSAGE_ID" not in plain
    # every field name is one journald accepts (uppercase, digits, underscore)
    for entry in sent:
        for key in entry:
            assert key.replace("_", "").isalnum() and key.isupper(), key


def test_stderr_is_journal_matches_device_and_inode(monkeypatch: pytest.MonkeyPatch) -> None:
    dev, _, ino = stderr_journal_stream().partition(":")
    monkeypatch.setenv("JOURNAL_STREAM", f"{dev}:{ino}")
    assert journal.stderr_is_journal()
    # inherited from a parent whose stderr was the journal: ours is another file
    monkeypatch.setenv("JOURNAL_STREAM", f"{dev}:{int(ino) + 1}")
    assert not journal.stderr_is_journal()
    monkeypatch.setenv("JOURNAL_STREAM", "junk")
    assert not journal.stderr_is_journal()
    monkeypatch.delenv("JOURNAL_STREAM")
    assert not journal.stderr_is_journal()


def test_journal_handler_with_real_send(
    logger: logging.Logger, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Through systemd-python's own send() (only its socket write, sendv, replaced): it
    rejects a str CODE_LINE, which a fake sender does not notice."""
    sent = journal_entries(monkeypatch)
    journal_logging("info", monkeypatch)
    logfields.log_event(logger, logfields.MESSAGE_START, "rdmad ready", device="rxe0")
    (entry,) = sent
    assert entry["MESSAGE"] == "rdmad ready"
    assert entry["RDMAD_DEVICE"] == "rxe0"
    assert re.fullmatch(r"\d+", entry["CODE_LINE"]), entry
