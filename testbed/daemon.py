"""The real rdmad process for end-to-end tests, and a plain D-Bus client to talk to it.

`RdmadProcess` starts `python -m rdmad.daemon.main` with its own NOTIFY_SOCKET, so "started"
means the daemon said READY=1 (the same signal systemd waits for), never a sleep. With an
RDMAD_TEST_* variable in its `env` it starts `python -m testbed.faulty_rdmad` instead:
the same daemon with those faults installed.
`Client` speaks raw D-Bus to io.rdmad1 and collects its signals, so tests see exactly what
a runtime's bindings would see.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dbus_fast import Message, MessageType
from dbus_fast.aio import MessageBus

from rdmad.bus.connection import BusConnection
from testbed import faulty_rdmad
from testbed.children import spawn

BUS_NAME = "io.rdmad1"
MANAGER_PATH = "/io/rdmad1"
MANAGER_IFACE = "io.rdmad1.Manager"
ROOT = Path(__file__).resolve().parents[1]


class DBusCallError(Exception):
    def __init__(self, name: str, message: str) -> None:
        super().__init__(f"{name}: {message}")
        self.name = name
        self.message = message


@dataclass
class RdmadProcess:
    bus_address: str
    workdir: Path
    sim_devices: str = ""
    sim_mode: str = "shared"
    extra_args: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    proc: asyncio.subprocess.Process | None = None
    log_path: Path | None = None
    notified: list[str] = field(default_factory=list)  # sd_notify messages, in order

    @property
    def state_dir(self) -> Path:
        return self.workdir / "state"

    @property
    def cdi_dir(self) -> Path:
        return self.workdir / "cdi"

    @property
    def entry_point(self) -> str:
        faulty = any(k.startswith(faulty_rdmad.PREFIX) for k in self.env)
        return faulty_rdmad.__name__ if faulty else "rdmad.daemon.main"

    def argv(self) -> list[str]:
        args = [
            sys.executable,
            "-m",
            self.entry_point,
            "--bus-address",
            self.bus_address,
            "--state-dir",
            str(self.state_dir),
            "--cdi-dir",
            str(self.cdi_dir),
            "--log-level",
            "debug",
        ]
        if self.sim_devices:
            args += ["--sim-devices", self.sim_devices, "--sim-mode", self.sim_mode]
        return args + self.extra_args

    async def start(self, timeout: float = 60.0) -> None:
        """Spawn the daemon and return once it has sent READY=1; fail with its log if not."""
        sock_dir = tempfile.mkdtemp(prefix="rdmad-notify-")
        sock_path = os.path.join(sock_dir, "notify")
        notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
        notify.bind(sock_path)
        notify.setblocking(False)
        self.log_path = self.workdir / f"rdmad-{os.getpid()}-{id(self)}.log"
        env = {**os.environ, "NOTIFY_SOCKET": sock_path, "PYTHONPATH": str(ROOT), **self.env}
        env.pop("JOURNAL_STREAM", None)
        with open(self.log_path, "ab") as logf:
            self.proc = await spawn(
                *self.argv(), stdin=asyncio.subprocess.DEVNULL, stdout=logf, stderr=logf, env=env
            )
        try:
            await asyncio.wait_for(self._ready(notify), timeout)
        except (TimeoutError, RuntimeError) as exc:
            await self.kill()
            raise RuntimeError(f"rdmad did not become ready ({exc!r}); log:\n{self.log()}") from exc
        finally:
            notify.close()
            os.unlink(sock_path)
            os.rmdir(sock_dir)

    async def _ready(self, notify: socket.socket) -> None:
        loop = asyncio.get_running_loop()
        assert self.proc is not None
        exited = asyncio.ensure_future(self.proc.wait())
        try:
            while True:
                recv = asyncio.ensure_future(loop.sock_recv(notify, 4096))
                done, _ = await asyncio.wait({recv, exited}, return_when=asyncio.FIRST_COMPLETED)
                if recv not in done:
                    recv.cancel()
                    raise RuntimeError(f"rdmad exited with {self.proc.returncode}")
                self.notified.append(recv.result().decode(errors="replace"))
                if b"READY=1" in recv.result().split(b"\n"):
                    return
        finally:
            if not exited.done():
                exited.cancel()

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path else ""

    async def stop(self, timeout: float = 30.0) -> int:
        """SIGTERM, as systemd stops it; returns the exit code."""
        assert self.proc is not None
        if self.proc.returncode is None:
            self.proc.send_signal(signal.SIGTERM)
        return await asyncio.wait_for(self.proc.wait(), timeout)

    async def kill(self) -> None:
        """SIGKILL: no chance to clean up, as after a crash."""
        if self.proc is not None and self.proc.returncode is None:
            self.proc.kill()
            await self.proc.wait()


class Client:
    """A D-Bus client of io.rdmad1 that records every signal the daemon sends."""

    def __init__(self, bus: MessageBus) -> None:
        self.bus = bus
        self.signals: list[Message] = []
        self._changed = asyncio.Event()

    @classmethod
    async def connect(cls, address: str, signals: bool = True) -> Client:
        """Connected; with `signals`, subscribed to every signal under /io/rdmad1 (a
        claimant such as rdmad-cni or `rdmactl claim` subscribes to none)."""
        # rdmad's own connection class: a bus restart ends it with one cause, not a
        # "Future exception was never retrieved" traceback per message in flight
        bus = await BusConnection(address, negotiate_unix_fd=True).connect()
        client = cls(bus)
        bus.add_message_handler(client._on_message)
        if not signals:
            return client
        await client.call_raw(
            "org.freedesktop.DBus",
            "/org/freedesktop/DBus",
            "org.freedesktop.DBus",
            "AddMatch",
            "s",
            ["type='signal',path_namespace='/io/rdmad1'"],
        )
        return client

    def _on_message(self, msg: Message) -> None:
        if msg.message_type == MessageType.SIGNAL and (msg.path or "").startswith(MANAGER_PATH):
            self.signals.append(msg)
            self._changed.set()

    async def call_raw(
        self,
        dest: str,
        path: str,
        iface: str,
        member: str,
        sig: str = "",
        body: Any = (),
        unix_fds: list[int] | None = None,
    ) -> list[Any]:
        reply = await self.bus.call(
            Message(
                destination=dest,
                path=path,
                interface=iface,
                member=member,
                signature=sig,
                body=list(body),
                unix_fds=unix_fds or [],
            )
        )
        assert reply is not None
        if reply.message_type == MessageType.ERROR:
            text = reply.body[0] if reply.body else ""
            raise DBusCallError(reply.error_name or "", str(text))
        return list(reply.body)

    async def manager(self, member: str, sig: str = "", *body: Any) -> Any:
        out = await self.call_raw(BUS_NAME, MANAGER_PATH, MANAGER_IFACE, member, sig, body)
        return out[0] if len(out) == 1 else out

    async def prop(self, path: str, iface: str, name: str) -> Any:
        (variant,) = await self.call_raw(
            BUS_NAME, path, "org.freedesktop.DBus.Properties", "Get", "ss", [iface, name]
        )
        return variant.value

    async def wait_signal(
        self,
        member: str,
        match: Callable[[list[Any]], bool] = lambda _b: True,
        timeout: float = 10.0,
        since: int = 0,
    ) -> list[Any]:
        """The body of the first `member` signal (from index `since`) that `match` accepts."""

        async def scan() -> list[Any]:
            seen = since
            while True:
                for msg in self.signals[seen:]:
                    if msg.member == member and match(list(msg.body)):
                        return list(msg.body)
                seen = len(self.signals)
                self._changed.clear()
                await self._changed.wait()

        try:
            return await asyncio.wait_for(scan(), timeout)
        except TimeoutError:
            got = [(m.member, m.body) for m in self.signals[since:]]
            raise AssertionError(f"no {member} signal within {timeout}s; got {got}") from None

    def property_changes(self, path: str, name: str, since: int = 0) -> list[Any]:
        """Each value PropertiesChanged gave property `name` of object `path`, in order."""
        return [
            m.body[1][name].value
            for m in self.signals[since:]
            if m.member == "PropertiesChanged" and m.path == path and name in m.body[1]
        ]

    async def wait_property(
        self, path: str, name: str, value: Any, since: int = 0, timeout: float = 10.0
    ) -> None:
        """Wait for a PropertiesChanged that sets `name` of `path` to `value`."""
        await self.wait_signal(
            "PropertiesChanged",
            lambda b: name in b[1] and b[1][name].value == value,
            timeout=timeout,
            since=since,
        )

    def mark(self) -> int:
        """An index to pass as `since`, so a wait sees only signals after this point."""
        return len(self.signals)

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.bus.disconnect()
