"""testbed/faulty_rdmad.py: the fault-injecting entry point the reliability tests run."""

from __future__ import annotations

from pathlib import Path

import pytest

from testbed import faulty_rdmad
from testbed.daemon import RdmadProcess


def test_a_misspelt_fault_variable_stops_the_daemon_instead_of_running_without_it() -> None:
    with pytest.raises(SystemExit, match="unknown fault variables"):
        faulty_rdmad.install({"RDMAD_TEST_CRASH_ATT": "pending-written"})


def test_a_fault_variable_selects_the_faulty_entry_point(tmp_path: Path) -> None:
    plain = RdmadProcess("unix:path=/nonexistent", tmp_path)
    faulty = RdmadProcess(
        "unix:path=/nonexistent",
        tmp_path,
        env={faulty_rdmad.CRASH_AT: "pending-written"},
    )
    assert plain.argv()[1:3] == ["-m", "rdmad.daemon.main"]
    assert faulty.argv()[1:3] == ["-m", "testbed.faulty_rdmad"]
