"""A real, private dbus-daemon for tests.

Use the fixtures by importing them into a conftest.py:

    from testbed.bus import policy_bus, private_bus  # noqa: F401

- `private_bus`: a system-like bus that lets everyone do everything.
- `policy_bus`: the same, with the shipped dbus/io.rdmad1.conf included, so the bus
  itself enforces rdmad's policy (non-root callers are refused mutating methods).
Both are session-scoped PrivateBus objects; `.address` goes to DBUS_SYSTEM_BUS_ADDRESS,
`--bus-address` or MessageBus(bus_address=...).

Or call start_private_bus() yourself (a context manager). The socket lives in a world-
searchable temp dir, so `run_as()` can call the bus as another uid.

Without dbus-daemon the fixtures skip, except when CI=true: then they fail.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import os
import platform
import selectors
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

from testbed.children import popen

REPO = Path(__file__).resolve().parents[1]
SHIPPED_POLICY = REPO / "dbus" / "io.rdmad1.conf"
START_TIMEOUT = 10.0

_CONFIG = """<!DOCTYPE busconfig PUBLIC "-//freedesktop//DTD D-Bus Bus Configuration 1.0//EN"
 "http://www.freedesktop.org/standards/dbus/1.0/busconfig.dtd">
<busconfig>
  <type>system</type>
  <listen>unix:path={socket}</listen>
  <auth>EXTERNAL</auth>
  <policy context="default">
    <allow user="*"/>
    <allow own="*"/>
    <allow send_destination="*" eavesdrop="true"/>
    <allow eavesdrop="true"/>
  </policy>
{includes}
</busconfig>
"""


@dataclass
class PrivateBus:
    address: str
    directory: Path
    config: Path
    process: subprocess.Popen[bytes]

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        shutil.rmtree(self.directory, ignore_errors=True)


class BusUnavailable(RuntimeError):
    pass


def write_config(directory: Path, includes: Sequence[Path] = ()) -> Path:
    text = _CONFIG.format(
        socket=directory / "system_bus_socket",
        includes="\n".join(f"  <include>{p}</include>" for p in includes),
    )
    config = directory / "bus.conf"
    config.write_text(text)
    return config


@contextmanager
def start_private_bus(includes: Sequence[Path] = ()) -> Iterator[PrivateBus]:
    """Start dbus-daemon with the given config files included; stop it on exit.

    Ready when the daemon prints its address (no sleeps). Raises BusUnavailable.
    """
    daemon = shutil.which("dbus-daemon")
    if daemon is None:
        raise BusUnavailable("dbus-daemon is not installed")
    directory = Path(tempfile.mkdtemp(prefix="rdmad-bus-"))
    directory.chmod(0o755)  # so run_as() callers can reach the socket
    config = write_config(directory, includes)
    proc = popen(
        [daemon, f"--config-file={config}", "--nofork", "--print-address=1", "--nopidfile"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert proc.stdout is not None
    with selectors.DefaultSelector() as sel:
        sel.register(proc.stdout, selectors.EVENT_READ)
        ready = sel.select(timeout=START_TIMEOUT)
    line = proc.stdout.readline().decode().strip() if ready else ""
    bus = PrivateBus(line, directory, config, proc)
    if not line:
        bus.stop()
        err = proc.stderr.read().decode() if proc.stderr else ""
        raise BusUnavailable(f"dbus-daemon did not start: {err.strip() or 'timeout'}")
    try:
        yield bus
    finally:
        bus.stop()


def _bus_or_skip(includes: Sequence[Path]) -> Iterator[PrivateBus]:
    try:
        with start_private_bus(includes) as bus:
            yield bus
            return
    except BusUnavailable as exc:
        reason = str(exc)
    if os.environ.get("CI") == "true":
        pytest.fail(f"a private dbus-daemon is required in CI: {reason}")
    pytest.skip(reason)


@pytest.fixture(scope="session")
def private_bus() -> Iterator[PrivateBus]:
    yield from _bus_or_skip(())


@pytest.fixture(scope="session")
def policy_bus() -> Iterator[PrivateBus]:
    yield from _bus_or_skip((SHIPPED_POLICY,))


# --- calling as another user (needs root) ---

NOBODY = 65534
# The venv's interpreter may sit under /root (unreadable to nobody); the system python of
# the same version reads the venv's site-packages just as well.
_SYSTEM_PYTHON = f"/usr/bin/python{sys.version_info.major}.{sys.version_info.minor}"
CALLER_PYTHON = _SYSTEM_PYTHON if os.path.exists(_SYSTEM_PYTHON) else sys.executable
_CALL = """
import asyncio, os, sys
from dbus_fast import Message, MessageType, Variant
from dbus_fast.aio import MessageBus

async def main():
    bus = await MessageBus(bus_address=sys.argv[1], negotiate_unix_fd=True).connect()
    path, iface, member, sig = sys.argv[2:6]
    body = eval(sys.argv[6])
    # an 'h' argument is index 0 of the fds sent with the call: the caller's own netns
    fds = [os.open("/proc/self/ns/net", os.O_RDONLY)] if "h" in sig else []
    reply = await bus.call(Message(destination="io.rdmad1", path=path, interface=iface,
                                   member=member, signature=sig, body=body, unix_fds=fds))
    if reply.message_type is not MessageType.ERROR:
        print("ok")
    elif sys.argv[7] == "message":
        print(f"{reply.error_name}: {reply.body[0] if reply.body else ''}")
    else:
        print(reply.error_name)

asyncio.run(main())
"""


# setresuid(2) and setresgid(2) by number: glibc's wrappers change every thread's ids
SETRESUID, SETRESGID = {"x86_64": (117, 119), "aarch64": (147, 149)}[platform.machine()]
_libc = ctypes.CDLL(None, use_errno=True)


def _syscall(number: int, *ids: int) -> None:
    if _libc.syscall(number, *ids) != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, os.strerror(errno))


@contextlib.contextmanager
def this_thread_as(uid: int) -> Iterator[None]:
    """This thread alone runs as `uid` meanwhile (its saved uid stays 0, to come back): a
    bus connection made then is `uid`'s, as the bus daemon records its peer at connect."""
    _syscall(SETRESGID, uid, uid, 0)
    _syscall(SETRESUID, uid, uid, 0)
    try:
        yield
    finally:
        _syscall(SETRESUID, 0, 0, 0)
        _syscall(SETRESGID, 0, 0, 0)


def caller_env() -> dict[str, str]:
    """The environment in which CALLER_PYTHON, run as another uid, imports rdmad and its
    dependencies (the venv's site-packages and this checkout)."""
    return {"PYTHONPATH": f"{sysconfig.get_paths()['purelib']}:{REPO}", "PATH": "/usr/bin:/bin"}


async def run_as(
    address: str,
    path: str,
    interface: str,
    member: str,
    signature: str = "",
    body: str = "[]",
    *,
    uid: int = NOBODY,
    extra_groups: Sequence[int] = (),
    message: bool = False,
    wrap: Sequence[str] = (),
) -> str:
    """Make one call to io.rdmad1 from a process running as `uid`; returns "ok" or the
    error name (`message`: "NAME: message"). `body` is a Python expression (Variant is in
    scope); an `h` argument is the caller's own netns. `wrap` runs the caller under a
    command (e.g. unshare). Async, so a service running on the test's own event loop can
    answer meanwhile."""
    proc = await asyncio.create_subprocess_exec(
        *wrap,
        CALLER_PYTHON,
        "-c",
        _CALL,
        address,
        path,
        interface,
        member,
        signature,
        body,
        "message" if message else "name",
        user=uid,
        group=NOBODY,
        extra_groups=list(extra_groups),
        env=caller_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        async with asyncio.timeout(30):
            out, err = await proc.communicate()
    except TimeoutError:
        proc.kill()
        await proc.wait()
        raise
    if proc.returncode != 0:
        raise RuntimeError(f"caller as uid {uid} failed: {err.decode().strip()}")
    return out.decode().strip()
