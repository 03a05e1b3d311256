"""How rdmactl ends when its output cannot be written: one line and its own exit status."""

from __future__ import annotations

import argparse
import asyncio
import errno
import io
import os
import sys
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any, TextIO, cast

import pytest
from dbus_fast import Message, MessageType
from dbus_fast.aio import MessageBus

from rdmad.bus.client import Client
from rdmad.bus.names import MANAGER_IFACE, MANAGER_PATH
from rdmad.cli import main as cli
from rdmad.cli.exitcodes import Exit


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
    assert code == Exit.OUTPUT
    assert capsys.readouterr().err == "rdmactl: cannot write the output: No space left on device\n"


class OneSignalBus:
    """A bus that delivers one Released signal, then waits until it is disconnected."""

    def __init__(self) -> None:
        self.handlers: list[Callable[[Message], None]] = []
        self.disconnected = asyncio.Event()

    async def call(self, msg: Message) -> Any:
        return SimpleNamespace(message_type=MessageType.METHOD_RETURN, body=[])  # AddMatch

    def add_message_handler(self, handler: Callable[[Message], None]) -> None:
        self.handlers.append(handler)

    async def wait_for_disconnect(self) -> None:
        signal = Message.new_signal(
            MANAGER_PATH, MANAGER_IFACE, "Released", "sss", ["c1", "mlx5_0", "requested"]
        )
        for handler in self.handlers:
            handler(signal)
        await self.disconnected.wait()

    def disconnect(self) -> None:
        self.disconnected.set()


class FullDisk(io.StringIO):
    def write(self, text: str) -> int:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


async def test_monitor_stops_when_its_output_cannot_be_written() -> None:
    # instead of a traceback for every signal, on and on
    client = Client(cast(MessageBus, OneSignalBus()), 5)
    with pytest.raises(OSError) as exc:
        await cli.cmd_monitor(client, cli.parse_args(["monitor"]), FullDisk())
    assert exc.value.errno == errno.ENOSPC
