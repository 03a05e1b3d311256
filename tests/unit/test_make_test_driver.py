"""`make test`'s driver, scripts/timed-stages.sh, run with a make that only records its calls.

The stages before `--` run one after the other; each quoted lane after it runs side by side
with the others; the first failure stops everything, and the summary names every stage.
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

DRIVER = Path(__file__).resolve().parents[2] / "scripts" / "timed-stages.sh"

# A stage named `fail` exits 3; `hang` waits for ever (only a stop ends it); `meet` and
# `greet` meet through a FIFO, which only returns when both run at the same time.
FAKE_MAKE = """#!/bin/bash
stage=${@: -1}
echo "$stage ${*:1:$#-1}" >> calls
case $stage in
    fail) exit 3 ;;
    hang) exec sleep infinity ;;
    meet) cat rendezvous > /dev/null ;;
    greet) echo hello > rendezvous ;;
esac
echo "the output of $stage"
"""


@dataclass
class Run:
    rc: int
    out: str
    calls: list[str]


Drive = Callable[..., Run]


@pytest.fixture
def drive(tmp_path: Path) -> Drive:
    make = tmp_path / "make"
    make.write_text(FAKE_MAKE)
    make.chmod(0o755)
    subprocess.run(["mkfifo", tmp_path / "rendezvous"], check=True)

    def run(*args: str) -> Run:
        done = subprocess.run(
            [DRIVER, str(make), *args], cwd=tmp_path, capture_output=True, text=True, timeout=60
        )
        calls = (tmp_path / "calls").read_text().splitlines()
        return Run(done.returncode, done.stdout, calls)

    return run


def summary(out: str) -> dict[str, str]:
    """The summary's lines, stage -> what it says of it."""
    lines = out.split("make test: the time of each stage\n", 1)[1].splitlines()
    return {line.split()[0]: line.split(None, 1)[1] for line in lines if line.strip()}


def test_each_stage_is_made_once_with_the_stages_before_it_assumed_made(drive: Drive) -> None:
    run = drive("setup", "deb", "--", "lint host", "kernels guest")
    assert run.rc == 0
    assert sorted(run.calls) == sorted(
        [
            "setup --no-print-directory",
            "deb --no-print-directory --assume-old=setup",
            "lint --no-print-directory --assume-old=setup --assume-old=deb",
            "host --no-print-directory --assume-old=setup --assume-old=deb --assume-old=lint",
            "kernels --no-print-directory --assume-old=setup --assume-old=deb",
            "guest --no-print-directory --assume-old=setup --assume-old=deb --assume-old=kernels",
        ]
    )


def test_the_lanes_run_side_by_side(drive: Drive) -> None:
    run = drive("setup", "--", "meet", "greet")
    assert run.rc == 0, run.out


def test_a_lanes_stage_output_is_printed_whole_under_its_name(drive: Drive) -> None:
    run = drive("setup", "--", "lint")
    assert "================================ lint (exit 0)\nthe output of lint\n" in run.out


def test_a_failed_stage_stops_the_other_lanes_and_is_the_exit_status(drive: Drive) -> None:
    run = drive("setup", "--", "lint fail host", "hang guest")
    assert run.rc == 3
    said = summary(run.out)
    assert said["fail"].endswith("FAILED (exit 3)")
    assert said["hang"] == "stopped"
    assert said["host"] == "not run"
    assert said["guest"] == "not run"


def test_a_failed_first_stage_runs_no_lane(drive: Drive) -> None:
    run = drive("fail", "deb", "--", "lint")
    assert run.rc == 3
    assert run.calls == ["fail --no-print-directory"]
    assert summary(run.out)["deb"] == "not run"
    assert summary(run.out)["lint"] == "not run"


def test_the_summary_ends_with_the_wall_time(drive: Drive) -> None:
    run = drive("setup", "--", "lint")
    assert run.out.splitlines()[-1].split()[:2] == ["wall", "time"]
