"""Real network namespaces and links for tests, always cleaned up.

Everything here shells out to iproute2 (`ip`), the same tool an operator would use, so a
test checks rdmad against an independent view of the kernel. Names are unique per process
and call (`unique_name`), so test runs can share a host.

Typical use::

    def test_x(netns: str, veth: VethPair) -> None:   # fixtures in tests/host/conftest.py
        ...
        assert link_in_netns(netns, "net1")["mtu"] == 1400

Waiting: never sleep. Subscribe first, act, then `await wait_for(queue, predicate)`.
`eventually(condition)` polls, and is only for state that nothing announces (the kernel's
GID table, another process's state, a log line).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import os
import pwd
import subprocess
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, TypeVar

import pytest

T = TypeVar("T")

_counter = itertools.count()


def unique_name(prefix: str, room: int = 0) -> str:
    """A name unique to this process and call, short enough for an ifname (15 chars) with
    `room` more characters after it. The pid and the count are in base 36, so that a
    session's thousands of names stay short."""
    name = f"{prefix}{_base36(os.getpid())}x{_base36(next(_counter))}"
    if len(name) + room > 15:
        raise ValueError(f"{name!r} leaves no room for {room} more in an interface name")
    return name


def _base36(n: int) -> str:
    digits = "0123456789abcdefghijklmnopqrstuvwxyz"
    out = digits[n % 36]
    while n >= 36:
        n //= 36
        out = digits[n % 36] + out
    return out


def require_root() -> None:
    """Skip without root, but FAIL under CI=true: in CI a skip would hide a missing test."""
    if os.geteuid() == 0:
        return
    if os.environ.get("CI") == "true":
        pytest.fail("these tests need root (real netns, veth, macvlan), and CI=true is set")
    pytest.skip("needs root")


def ip(*args: str, netns: str | None = None, check: bool = True) -> str:
    """Run `ip [-n NETNS] ARGS...`; return stdout. Raises with stderr on failure."""
    cmd = ["ip", *(["-n", netns] if netns else []), *args]
    res = subprocess.run(cmd, capture_output=True, text=True)
    if check and res.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed: {res.stderr.strip()}")
    return res.stdout


def ip_json(*args: str, netns: str | None = None) -> list[dict[str, Any]]:
    """`ip -j ARGS...` parsed; an empty list when ip prints nothing."""
    out = ip("-j", *args, netns=netns)
    return list(json.loads(out)) if out.strip() else []


def link(name: str, netns: str | None = None) -> dict[str, Any] | None:
    """`ip -j -d link show NAME` in init_net or `netns`, or None if there is no such link."""
    res = subprocess.run(
        ["ip", *(["-n", netns] if netns else []), "-j", "-d", "link", "show", "dev", name],
        capture_output=True,
        text=True,
    )
    if res.returncode != 0:
        return None
    links = json.loads(res.stdout)
    return dict(links[0]) if links else None


def link_names(netns: str | None = None) -> set[str]:
    return {str(x["ifname"]) for x in ip_json("link", "show", netns=netns)}


def addresses(name: str, netns: str | None = None) -> set[str]:
    """CIDRs on a link, without IPv6 link-local ones."""
    out: set[str] = set()
    for entry in ip_json("addr", "show", "dev", name, netns=netns):
        for a in entry.get("addr_info", []):
            if a["family"] == "inet6" and str(a["local"]).startswith("fe80:"):
                continue
            out.add(f"{a['local']}/{a['prefixlen']}")
    return out


def link_local_usable(name: str, netns: str | None = None) -> bool:
    """Whether `name` has an IPv6 link-local address past duplicate address detection.

    The kernel routes from no tentative address, so RDMA over a link-local GID (which the
    GID table holds from the moment the link is up) fails to connect its QP until then.
    """
    return any(
        a["family"] == "inet6" and str(a["local"]).startswith("fe80:") and not a.get("tentative")
        for entry in ip_json("addr", "show", "dev", name, netns=netns)
        for a in entry.get("addr_info", [])
    )


def is_up(info: dict[str, Any]) -> bool:
    return "UP" in info.get("flags", [])


def netns_inode(name: str) -> int:
    return os.stat(f"/run/netns/{name}").st_ino


def netns_nsid(name: str) -> int:
    """The nsid init_net gives the named netns (-1 if none)."""
    found = [n for n in ip_json("netns", "list") if n["name"] == name]
    assert found, f"no netns {name}"
    return int(found[0].get("id", -1))


@contextlib.contextmanager
def temp_netns(prefix: str = "rt") -> Iterator[str]:
    """A named netns (/run/netns/NAME) that is deleted afterwards, whatever happens."""
    name = unique_name(prefix)
    ip("netns", "add", name)
    try:
        yield name
    finally:
        ip("netns", "del", name, check=False)


@contextlib.contextmanager
def netns_fd(name: str) -> Iterator[int]:
    """An fd of named netns `name`, closed afterwards."""
    fd = os.open(f"/run/netns/{name}", os.O_RDONLY | os.O_CLOEXEC)
    try:
        yield fd
    finally:
        os.close(fd)


@contextlib.contextmanager
def users_netns(uid: int, prefix: str = "ru") -> Iterator[str]:
    """A named netns (/run/netns/NAME) that `uid` owns, as a rootless container's: made by
    `uid` with a user namespace of its own (held by its process meanwhile), and named by
    a bind mount. Unnamed and ended afterwards."""
    as_uid = ["setpriv", f"--reuid={uid}", f"--regid={pwd.getpwuid(uid).pw_gid}", "--clear-groups"]
    holder = subprocess.Popen(
        [*as_uid, "unshare", "--user", "--net", "sh", "-c", "echo ready; read _"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
    )
    path = f"/run/netns/{unique_name(prefix)}"
    try:
        assert holder.stdout is not None and holder.stdout.readline() == b"ready\n"
        os.makedirs("/run/netns", exist_ok=True)
        open(path, "x").close()
        subprocess.run(["mount", "--bind", f"/proc/{holder.pid}/ns/net", path], check=True)
        yield os.path.basename(path)
    finally:
        subprocess.run(["umount", path], check=False, capture_output=True)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        holder.communicate(b"\n", timeout=30)


@dataclass(frozen=True)
class VethPair:
    host: str  # in init_net
    peer: str  # in init_net unless moved by the test

    def host_ifindex(self) -> int:
        info = link(self.host)
        assert info is not None, f"{self.host} is gone"
        return int(info["ifindex"])


def fixed_mac() -> str:
    """A random locally administered unicast MAC, given when a link is made. A link the
    kernel gives a random MAC is one udevd's MACAddressPolicy=persistent (99-default.link)
    re-addresses when its uevent is handled, maybe after the test set the link up: the link
    keeps the old MAC's IPv6 link-local address, while a RoCE device on it moves its GID 0
    to the new MAC, so a QP on that GID never reaches RTR (seen in the 7.3 guest,
    docs/kernel-notes.md). udevd leaves a MAC given at creation alone."""
    first, *rest = os.urandom(6)
    return ":".join(f"{b:02x}" for b in ((first & 0xFC) | 0x02, *rest))


@contextlib.contextmanager
def temp_veth(prefix: str = "rv") -> Iterator[VethPair]:
    """A veth pair in init_net with fixed MACs (`fixed_mac`), deleted afterwards (deleting
    either end kills both)."""
    a, b = unique_name(prefix), unique_name(prefix)
    ip("link", "add", a, "address", fixed_mac(), "type", "veth",
       "peer", "name", b, "address", fixed_mac())  # fmt: skip
    try:
        yield VethPair(a, b)
    finally:
        for n in (a, b):
            ip("link", "del", n, check=False)


async def wait_for(
    queue: asyncio.Queue[T], predicate: Callable[[T], bool], within: float = 5.0
) -> T:
    """The first item from `queue` matching `predicate`; TimeoutError after `within` s.
    Items that do not match are dropped."""
    async with asyncio.timeout(within):
        while True:
            item = await queue.get()
            if predicate(item):
                return item


# granularity of eventually()'s bounded polls (never a fixed sleep)
POLL_S = 0.02


async def eventually(check: Callable[[], bool], within: float, what: str = "") -> None:
    """Poll `check` until it holds; TimeoutError naming `what` after `within` s. Only for
    state that nothing announces: every other wait is on an event."""
    try:
        async with asyncio.timeout(within):
            while not check():  # noqa: ASYNC110 - nothing to wait on: nothing announces it
                await asyncio.sleep(POLL_S)
    except TimeoutError:
        raise TimeoutError(f"timed out after {within} s waiting for {what or check}") from None


def queue_sink(queue: asyncio.Queue[T]) -> Callable[[T], None]:
    """An EventSink that puts events on `queue` (for EventSource.start)."""
    return queue.put_nowait


async def run(cmd: list[str]) -> str:
    """Run a command without blocking the event loop (e.g. while an event source reads)."""
    proc = await asyncio.create_subprocess_exec(
        *cmd, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    out, err = await proc.communicate()
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed: {err.decode().strip()}")
    return out.decode()
