"""Network namespaces as files: open, verify, find again by inode, and run code inside one.

rdmad never pins a claimed netns: a `NetnsHandle` lives for one operation, and `reopen`
finds a netns again through whatever still holds it (a bind mount, a process, an fd).
An inode names a netns only while it lives: the kernel gives it to the next namespace made
after its death. Its cookie (`cookie`) is never given to another until reboot.

`run_in_netns` runs a blocking callable on a dedicated thread that has `setns()`'d into a
netns, for the few kernel requests that take the *calling thread's* netns as an argument
(moving an RDMA device back home) or need a socket created inside it (netlink sockets
keep the netns they were created in).
"""

from __future__ import annotations

import asyncio
import ctypes
import fcntl
import functools
import os
import re
import socket
import stat
import sys
import threading
import weakref
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

from rdmad.core.backend import NetnsTarget
from rdmad.errors import AccessDenied, InvalidNetns
from rdmad.kernel.nlsocket import open_socket, rtnl_busy
from rdmad.model import netns_label

CLONE_NEWNET = 0x40000000
NS_GET_USERNS = 0xB701  # _IO(0xb7, 0x1), include/uapi/linux/nsfs.h
NS_GET_NSTYPE = 0xB703  # _IO(0xb7, 0x3)
NS_GET_OWNER_UID = 0xB704  # _IO(0xb7, 0x4)
SO_NETNS_COOKIE = 71  # include/uapi/asm-generic/socket.h, Linux 5.14; not in Python 3.11

RUN_NETNS = "/run/netns"
SELF_NETNS = "/proc/self/ns/net"  # the thread-group leader's netns: init_net for rdmad

_OPEN_FLAGS = os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK | os.O_NOCTTY
_NOT_NS_FDS = ("socket:", "pipe:", "anon_inode:")
_NAME_RE = re.compile(r"[^/\x00]+")

T = TypeVar("T")


class NetnsHandle:
    """An open netns fd (implements rdmad.core.backend.NetnsTarget). Close it after one
    operation."""

    def __init__(self, fd: int, inode: int, path: str) -> None:
        self._fd = fd
        self._inode = inode
        self._path = path
        self._on_close: list[Callable[[], None]] = []

    @property
    def fd(self) -> int:
        if self._fd < 0:
            raise ValueError(f"netns handle for {netns_label(self._inode)} is closed")
        return self._fd

    @property
    def inode(self) -> int:
        return self._inode

    @property
    def path(self) -> str:
        return self._path

    def on_close(self, callback: Callable[[], None]) -> None:
        self._on_close.append(callback)

    def close(self) -> None:
        if self._fd >= 0:
            fd, self._fd = self._fd, -1
            os.close(fd)
            for callback in self._on_close:
                callback()
            self._on_close.clear()

    def __enter__(self) -> NetnsHandle:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"NetnsHandle({netns_label(self._inode)}, path={self._path!r}, fd={self._fd})"


def spec_to_path(spec: str) -> str:
    """Map a caller's netns spec to a path: absolute path, NAME (→ /run/netns/NAME), pid:PID."""
    if spec.startswith("/"):
        return spec
    if spec.startswith("pid:"):
        pid = spec[4:]
        if not (pid.isascii() and pid.isdecimal()) or int(pid) <= 0:
            raise InvalidNetns(f"{spec!r}: pid:PID needs a positive decimal pid")
        return f"/proc/{int(pid)}/ns/net"
    if not spec or spec in (".", "..") or not _NAME_RE.fullmatch(spec):
        raise InvalidNetns(
            f"{spec!r} is not a netns: give an absolute path, a plain name under "
            f"{RUN_NETNS}, or pid:PID"
        )
    return f"{RUN_NETNS}/{spec}"


def _kind_of(mode: int) -> str:
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISSOCK(mode):
        return "a socket"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device node"
    if stat.S_ISREG(mode):
        return "a regular file"
    return "not a regular file"


def _ns_type(fd: int) -> int:
    return int(fcntl.ioctl(fd, NS_GET_NSTYPE))


def owner_uid(fd: int) -> int:
    """The uid that owns the user namespace owning the namespace `fd` (as rdmad's own user
    namespace sees it): 0 for init_net and the netns root makes, the user's for a netns made
    in a user's user namespace (a rootless container's)."""
    userns = int(fcntl.ioctl(fd, NS_GET_USERNS))
    try:
        uid = bytearray(4)
        fcntl.ioctl(userns, NS_GET_OWNER_UID, uid)
    finally:
        os.close(userns)
    return int.from_bytes(uid, sys.byteorder)


class KernelNetnsResolver:
    """Implements rdmad.core.backend.NetnsResolver against the running kernel.

    Holds one fd of init_net (from /proc/self/ns/net: /proc/1/ns/net may be unreadable) to
    recognise init_net and to move things home. Holding it pins nothing: init_net never dies.
    """

    def __init__(self) -> None:
        self._init_fd = os.open(SELF_NETNS, _OPEN_FLAGS)
        st = os.fstat(self._init_fd)
        self._init_ino = st.st_ino
        self._nsfs_dev = st.st_dev

    @property
    def init_fd(self) -> int:
        return self._init_fd

    def close(self) -> None:
        if self._init_fd >= 0:
            fd, self._init_fd = self._init_fd, -1
            os.close(fd)

    # -- NetnsResolver ------------------------------------------------------------------

    def open(self, spec: str, owner: int | None = None) -> NetnsHandle:
        path = spec_to_path(spec)
        try:
            st = os.stat(path)
        except FileNotFoundError:
            raise InvalidNetns(self._missing(spec, path)) from None
        except OSError as e:
            raise InvalidNetns(f"{spec!r}: cannot stat {path}: {os.strerror(e.errno or 0)}") from e
        # Refuse before open(): opening a FIFO or a device node can block or have effects.
        self._check_stat(spec, st)
        try:
            fd = os.open(path, _OPEN_FLAGS)
        except FileNotFoundError:
            raise InvalidNetns(self._missing(spec, path)) from None
        except OSError as e:
            raise InvalidNetns(f"{spec!r}: cannot open {path}: {os.strerror(e.errno or 0)}") from e
        return self._wrap(fd, spec, path, owner)

    def adopt_fd(self, fd: int, owner: int | None = None) -> NetnsHandle:
        try:
            mine = os.dup(fd)
        except OSError as e:
            raise InvalidNetns(f"fd {fd} is not usable: {os.strerror(e.errno or 0)}") from e
        os.set_inheritable(mine, False)
        return self._wrap(mine, f"fd {fd}", "", owner)

    def reopen(self, inode: int, path_hint: str) -> NetnsHandle | None:
        if inode == self._init_ino:
            return None
        label = netns_label(inode)
        for path in candidate_paths(path_hint, label):
            handle = self.try_open(path)
            if handle is None:
                continue
            if handle.inode == inode:
                return handle
            handle.close()
        return None

    async def cookie(self, target: NetnsTarget) -> int:
        # Through the handle's rtnetlink socket, which a claim's requests there use next:
        # a socket made for the read alone would be closed, and freed through RCU, right
        # before the claim's move.
        try:
            sock = await rtnl_socket_in(target)
        except OSError as e:  # setns() or socket() on the worker
            raise InvalidNetns(f"cannot read the cookie of {netns_label(target.inode)}: {e}") from e
        return int.from_bytes(sock.getsockopt(socket.SOL_SOCKET, SO_NETNS_COOKIE, 8), sys.byteorder)

    def other_netns_exist(self) -> bool:
        return any(
            st.st_ino != self._init_ino
            for st in (self._stat_ns(p) for p in candidate_paths())
            if st is not None
        )

    # -- helpers ------------------------------------------------------------------------

    def try_open(self, path: str) -> NetnsHandle | None:
        """Open `path` if it is a live netns other than init_net, else None (never raises)."""
        st = self._stat_ns(path)
        if st is None or st.st_ino == self._init_ino:
            return None
        try:
            fd = os.open(path, _OPEN_FLAGS)
        except OSError:
            return None
        try:
            return self._wrap(fd, path, path)
        except InvalidNetns:
            return None  # raced: the path now names something else

    def _stat_ns(self, path: str) -> os.stat_result | None:
        try:
            st = os.stat(path)
        except OSError:
            return None
        if not stat.S_ISREG(st.st_mode) or st.st_dev != self._nsfs_dev:
            return None
        return st

    def _missing(self, spec: str, path: str) -> str:
        m = re.fullmatch(r"/proc/(\d+)/ns/net", path)
        if m and not os.path.exists(f"/proc/{m.group(1)}"):
            return f"{spec!r}: no process with pid {m.group(1)}"
        return f"{spec!r}: {path} does not exist"

    def _check_stat(self, spec: str, st: os.stat_result) -> None:
        if not stat.S_ISREG(st.st_mode) or st.st_dev != self._nsfs_dev:
            raise InvalidNetns(f"{spec!r} is {_kind_of(st.st_mode)}, not a network namespace")

    def _wrap(self, fd: int, spec: str, path: str, owner: int | None = None) -> NetnsHandle:
        """Verify an fd we own is a netns other than init_net, owned by `owner` if that is
        a uid; close it on any refusal."""
        try:
            st = os.fstat(fd)
            self._check_stat(spec, st)
            try:
                kind = _ns_type(fd)
            except OSError as e:
                raise InvalidNetns(f"{spec!r} is not a namespace file") from e
            if kind != CLONE_NEWNET:
                raise InvalidNetns(f"{spec!r} is a namespace, but not a network namespace")
            if owner is not None and owner_uid(fd) != owner:
                raise AccessDenied(
                    f"{spec!r} is not uid {owner}'s: a caller that is not root may claim "
                    "only into a network namespace its own user namespace owns"
                )
            if st.st_ino == self._init_ino:
                raise InvalidNetns(
                    f"{spec!r} is init_net, the host's own network namespace: "
                    "name a container's netns"
                )
        except BaseException:
            os.close(fd)
            raise
        return NetnsHandle(fd, st.st_ino, path)


# A handle's rtnetlink socket in its netns, from its first use until the handle closes.
_rtnl_sockets: weakref.WeakKeyDictionary[NetnsTarget, asyncio.Future[socket.socket]] = (
    weakref.WeakKeyDictionary()
)


def rtnl_socket_in(target: NetnsTarget) -> asyncio.Future[socket.socket]:
    """`target`'s rtnetlink socket, made by a worker inside its netns on the first call and
    closed with the handle: a claim reads the netns's cookie and tables, places its netdev
    and installs its routes through one. A socket closed frees itself through RCU, and a
    netns move soon after waits for that (docs/performance.md): one close per claim, with
    its handle after its move, not one before it. The worker starts on it at once, so it
    is made while the caller goes on (while the kernel moves a netdev, say)."""
    fd = target.fd  # raises once the handle is closed: never its closed socket
    made = _rtnl_sockets.get(target)
    if made is None:
        made = _rtnl_sockets[target] = submit_in_netns(
            fd, functools.partial(open_socket, socket.NETLINK_ROUTE)
        )
        target.on_close(functools.partial(_close_made, made))
    return made


def _close_made(made: asyncio.Future[socket.socket]) -> None:
    """Close the socket now, or once the worker has made it."""
    if not made.done():
        made.add_done_callback(_close_made)
    elif not made.cancelled() and made.exception() is None:
        made.result().close()  # a failed open: the operation reports its error


def candidate_paths(hint: str = "", fd_label: str | None = None) -> Iterator[str]:
    """Paths that may name a live netns, cheapest first: the hint, bind mounts under
    /run/netns, every task's ns/net, then open fds (only those reading `fd_label`, e.g.
    "net:[4026532]", or any when None) and fds that may be nsfs files opened through a
    bind mount. Lazily scanned; may repeat a netns; callers stat-check each path."""
    if hint:
        yield hint
    try:
        names = sorted(os.listdir(RUN_NETNS))
    except OSError:
        names = []
    for name in names:
        yield f"{RUN_NETNS}/{name}"
    pids = [p for p in _listdir("/proc") if p.isdecimal()]
    for pid in pids:
        yield f"/proc/{pid}/ns/net"
    for pid in pids:
        # threads may sit in another netns than their leader (e.g. run_in_netns workers)
        for tid in _listdir(f"/proc/{pid}/task"):
            if tid != pid:
                yield f"/proc/{pid}/task/{tid}/ns/net"
    for pid in pids:
        fd_dir = f"/proc/{pid}/fd"
        for n in _listdir(fd_dir):
            try:
                link = os.readlink(f"{fd_dir}/{n}")
            except OSError:
                continue
            if link.startswith(_NOT_NS_FDS):
                continue
            # An fd opened through a bind mount reads as that path ("/" once unmounted),
            # not "net:[...]": leave those to the stat check of whoever opens the path.
            if link.startswith("net:[") and fd_label is not None and link != fd_label:
                continue
            yield f"{fd_dir}/{n}"


def _listdir(path: str) -> list[str]:
    try:
        return os.listdir(path)
    except OSError:
        return []


# -- running code inside a netns ------------------------------------------------------------


class _Libc:
    def __init__(self) -> None:
        self._setns = ctypes.CDLL(None, use_errno=True).setns
        self._setns.argtypes = (ctypes.c_int, ctypes.c_int)
        self._setns.restype = ctypes.c_int

    def setns_net(self, fd: int) -> None:
        if self._setns(fd, CLONE_NEWNET) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"setns(CLONE_NEWNET): {os.strerror(err)}")


class NetnsRunner:
    """Runs blocking callables inside a netns on dedicated worker threads.

    Each call: setns() into the target, run, setns() back to init_net. If going back fails
    the worker's thread is unsafe to reuse, so the whole pool is retired.
    """

    def __init__(self, max_workers: int, name: str) -> None:
        self._init_fd = os.open(SELF_NETNS, os.O_RDONLY | os.O_CLOEXEC)
        self._libc = _Libc()
        self._max_workers = max_workers
        self._name = name
        self._lock = threading.Lock()
        self._pool = self._new_pool()

    def _new_pool(self) -> ThreadPoolExecutor:
        return ThreadPoolExecutor(self._max_workers, thread_name_prefix=self._name)

    async def run(self, target_fd: int, fn: Callable[[], T]) -> T:
        return await self.submit(target_fd, fn)

    def submit(self, target_fd: int, fn: Callable[[], T]) -> asyncio.Future[T]:
        """Hand `fn` to a worker now, without yielding to the loop first."""
        loop = asyncio.get_running_loop()
        with self._lock:
            pool = self._pool
        return loop.run_in_executor(pool, self._call, pool, target_fd, fn)

    def _call(self, pool: ThreadPoolExecutor, target_fd: int, fn: Callable[[], T]) -> T:
        self._libc.setns_net(target_fd)
        try:
            return fn()
        finally:
            try:
                self._libc.setns_net(self._init_fd)
            except OSError:
                self._retire(pool)
                raise

    def _retire(self, pool: ThreadPoolExecutor) -> None:
        with self._lock:
            if self._pool is pool:
                self._pool = self._new_pool()
        pool.shutdown(wait=False)


_runners: dict[str, NetnsRunner] = {}
_runners_lock = threading.Lock()
# In-netns work that takes a worker briefly: sockets made in a netns, reads there.
_WORK = ("rdmad-netns", 4)
# Netns moves. The kernel runs them one at a time under the RTNL lock; sent from several
# threads at once they queue there and end in bunches (a burst of 16 whole-device claims
# got most replies at once, 200 ms after the first few), while one thread ends each move
# before sending the next, in the order they were asked for.
_MOVES = ("rdmad-move", 1)


def _runner(kind: tuple[str, int]) -> NetnsRunner:
    name, workers = kind
    with _runners_lock:
        if name not in _runners:
            _runners[name] = NetnsRunner(workers, name)
        return _runners[name]


async def run_in_netns(target_fd: int, fn: Callable[[], T]) -> T:
    """Run `fn()` on a worker thread inside the netns open at `target_fd`; return its result.

    The event loop thread never changes netns. `fn` runs blocking code only (no asyncio);
    anything it creates that is bound to a netns at creation (a socket) keeps that netns
    after the thread goes back. The fd must stay open until this returns. Exceptions from
    `fn` propagate; a failing setns() raises OSError (EINVAL: not a netns fd).

    Example (RDMA adapter): an RDMA netlink socket inside a claim's netns::

        sock = await run_in_netns(target.fd, functools.partial(open_socket, NETLINK_RDMA))
    """
    return await _runner(_WORK).run(target_fd, fn)


def submit_in_netns(target_fd: int, fn: Callable[[], T]) -> asyncio.Future[T]:
    """`run_in_netns`, started before this returns: the worker runs while the caller goes on
    (a claim opens its in-netns socket while the mover thread sends its move). Keep the fd
    open until the future is done."""
    return _runner(_WORK).submit(target_fd, fn)


async def move_from_netns(from_fd: int, move: Callable[[], T]) -> T:
    """Send a netns move (a blocking callable) from the netns open at `from_fd`, on the one
    thread that sends every move, after the moves asked for before it."""
    with rtnl_busy():
        return await _runner(_MOVES).run(from_fd, move)
