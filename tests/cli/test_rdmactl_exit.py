"""How rdmactl ends when its output cannot be written: one line and its own exit status."""

from __future__ import annotations

import argparse
import sys
from typing import TextIO

import pytest

from rdmad import cli


async def prints_a_table(args: argparse.Namespace, out: TextIO | None = None) -> int:
    print("DEVICE  STATE      NETDEV\nsim0    available  eth0", file=sys.stdout)
    return 0


def test_output_that_cannot_be_written_exits_74_with_one_line(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # not 1, which says rdmad refused: nothing was refused
    monkeypatch.setattr(cli, "run", prints_a_table)
    with open("/dev/full", "w") as full_disk:  # every write that reaches it fails, ENOSPC
        monkeypatch.setattr(sys, "stdout", full_disk)  # here: capsys swaps its own in at call
        code = cli.main(["list"])
        monkeypatch.undo()
    assert code == cli.EXIT_OUTPUT == 74
    assert capsys.readouterr().err == "rdmactl: cannot write the output: No space left on device\n"
