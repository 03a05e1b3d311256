"""KernelNetnsResolver, run_in_netns and move_from_netns against real network namespaces."""

from __future__ import annotations

import asyncio
import functools
import os
import subprocess
import tempfile
import threading
from collections.abc import Iterator

import pytest

from rdmad.errors import AccessDenied, InvalidNetns
from rdmad.kernel.netns import (
    KernelNetnsResolver,
    NetnsHandle,
    move_from_netns,
    owner_uid,
    run_in_netns,
)
from testbed.net import netns_inode, temp_netns


def _open_fds() -> set[str]:
    return set(os.listdir("/proc/self/fd"))


@pytest.fixture
def no_fd_leak() -> Iterator[None]:
    before = _open_fds()
    yield
    assert _open_fds() <= before, "an fd leaked"


@pytest.fixture
def process_in_netns(netns: str) -> Iterator[subprocess.Popen[str]]:
    """A process living in `netns`; it ends when we close its stdin."""
    proc = subprocess.Popen(
        ["ip", "netns", "exec", netns, "sh", "-c", "echo ready; exec cat"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline() == "ready\n"  # printed after setns()
        yield proc
    finally:
        assert proc.stdin is not None
        proc.stdin.close()
        proc.wait()


def test_open_by_name_path_and_pid_give_the_same_netns(
    resolver: KernelNetnsResolver, netns: str
) -> None:
    want = netns_inode(netns)
    for spec in (netns, f"/run/netns/{netns}"):
        with resolver.open(spec) as h:
            assert (h.inode, h.path) == (want, f"/run/netns/{netns}")


def test_open_pid_spec_reaches_the_process_netns(
    resolver: KernelNetnsResolver, netns: str, process_in_netns: subprocess.Popen[str]
) -> None:
    pid = process_in_netns.pid
    with resolver.open(f"pid:{pid}") as h:
        assert (h.inode, h.path) == (netns_inode(netns), f"/proc/{pid}/ns/net")


def test_reopen_finds_netns_held_only_by_a_process(
    resolver: KernelNetnsResolver, netns: str, process_in_netns: subprocess.Popen[str]
) -> None:
    inode = netns_inode(netns)
    subprocess.run(["ip", "netns", "del", netns], check=True)  # only the process is left
    h = resolver.reopen(inode, f"/run/netns/{netns}")
    assert h is not None and h.inode == inode
    h.close()


def test_open_refuses_init_net(resolver: KernelNetnsResolver, no_fd_leak: None) -> None:
    with pytest.raises(InvalidNetns, match="init_net"):
        resolver.open("/proc/self/ns/net")


def test_open_refuses_fifo(resolver: KernelNetnsResolver, no_fd_leak: None) -> None:
    with tempfile.TemporaryDirectory() as d:
        fifo = os.path.join(d, "fifo")
        os.mkfifo(fifo)
        with pytest.raises(InvalidNetns, match="FIFO"):
            resolver.open(fifo)


def test_open_refuses_directory(resolver: KernelNetnsResolver, no_fd_leak: None) -> None:
    with pytest.raises(InvalidNetns, match="directory"):
        resolver.open("/run")


def test_open_refuses_regular_file(resolver: KernelNetnsResolver, no_fd_leak: None) -> None:
    with tempfile.NamedTemporaryFile() as f, pytest.raises(InvalidNetns, match="regular file"):
        resolver.open(f.name)


def test_open_refuses_other_namespace_types(
    resolver: KernelNetnsResolver, no_fd_leak: None
) -> None:
    with pytest.raises(InvalidNetns, match="not a network namespace"):
        resolver.open("/proc/self/ns/mnt")


def test_open_refuses_dead_pid(resolver: KernelNetnsResolver) -> None:
    proc = subprocess.Popen(["true"])
    proc.wait()
    with pytest.raises(InvalidNetns, match=f"no process with pid {proc.pid}"):
        resolver.open(f"pid:{proc.pid}")


@pytest.mark.parametrize("spec", ["", ".", "..", "a/b", "pid:", "pid:-1", "pid:x1"])
def test_open_refuses_malformed_specs(resolver: KernelNetnsResolver, spec: str) -> None:
    with pytest.raises(InvalidNetns):
        resolver.open(spec)


def test_open_refuses_missing_name(resolver: KernelNetnsResolver) -> None:
    with pytest.raises(InvalidNetns, match="does not exist"):
        resolver.open("rdmad-no-such-netns")


def test_adopt_fd_dups_and_leaves_the_callers_fd_open(
    resolver: KernelNetnsResolver, netns: str
) -> None:
    fd = os.open(f"/run/netns/{netns}", os.O_RDONLY)
    try:
        h = resolver.adopt_fd(fd)
        assert h.fd != fd and h.inode == netns_inode(netns) and h.path == ""
        h.close()
        os.fstat(fd)  # still open
    finally:
        os.close(fd)


def test_adopt_fd_refuses_init_net(resolver: KernelNetnsResolver, no_fd_leak: None) -> None:
    fd = os.open("/proc/self/ns/net", os.O_RDONLY)
    try:
        with pytest.raises(InvalidNetns, match="init_net"):
            resolver.adopt_fd(fd)
    finally:
        os.close(fd)


def test_reopen_uses_the_path_hint(resolver: KernelNetnsResolver, netns: str) -> None:
    h = resolver.reopen(netns_inode(netns), f"/run/netns/{netns}")
    assert h is not None and h.inode == netns_inode(netns)
    h.close()


@pytest.mark.usefixtures("root")  # temp_netns
def test_reopen_finds_netns_held_only_by_fd(resolver: KernelNetnsResolver) -> None:
    with temp_netns() as name:
        held = os.open(f"/run/netns/{name}", os.O_RDONLY)
        inode = netns_inode(name)
    try:  # the bind mount is gone; only `held` keeps the netns alive
        h = resolver.reopen(inode, f"/run/netns/{name}")
        assert h is not None and h.inode == inode
        h.close()
    finally:
        os.close(held)


@pytest.mark.usefixtures("root")  # temp_netns
def test_reopen_returns_none_for_a_dead_netns(resolver: KernelNetnsResolver) -> None:
    with temp_netns() as name:
        inode = netns_inode(name)
    assert resolver.reopen(inode, f"/run/netns/{name}") is None


async def test_a_netns_has_one_cookie_however_it_is_opened(
    resolver: KernelNetnsResolver,
    netns: str,
    process_in_netns: subprocess.Popen[str],
) -> None:
    with resolver.open(netns) as by_name, resolver.open(f"pid:{process_in_netns.pid}") as by_pid:
        assert await resolver.cookie(by_name) == await resolver.cookie(by_pid) > 0
    with temp_netns() as other, resolver.open(other) as another, resolver.open(netns) as again:
        assert await resolver.cookie(another) != await resolver.cookie(again)


@pytest.mark.usefixtures("root")  # temp_netns
async def test_a_netns_made_after_others_died_has_none_of_their_cookies(
    resolver: KernelNetnsResolver,
) -> None:
    """So a netns that the kernel gives a dead one's inode (it reuses inodes, lowest free
    first, once the dead one's cleanup has run: seconds to minutes later, which is why this
    does not wait for that) never has its cookie. Cookies are unique, not ordered: the
    kernel hands them out in per-CPU batches, so a later netns may have a smaller one."""
    cookies = []
    for _ in range(16):
        with temp_netns() as name, resolver.open(name) as gone:
            cookies.append(await resolver.cookie(gone))
    assert len(set(cookies)) == len(cookies)


def test_other_netns_exist_sees_a_named_netns(resolver: KernelNetnsResolver, netns: str) -> None:
    assert resolver.other_netns_exist()


async def test_run_in_netns_runs_inside_and_returns_to_init_net(
    resolver: KernelNetnsResolver, netns: str
) -> None:
    def where() -> int:
        return os.stat("/proc/thread-self/ns/net").st_ino

    init_net = os.stat("/proc/self/ns/net").st_ino
    with resolver.open(netns) as h:
        assert await run_in_netns(h.fd, where) == netns_inode(netns)
    # the same worker threads are back home
    assert await run_in_netns(resolver.init_fd, where) == init_net
    assert where() == init_net


async def test_run_in_netns_propagates_exceptions(
    resolver: KernelNetnsResolver, netns: str
) -> None:
    def boom() -> None:
        raise ValueError("inside")

    with resolver.open(netns) as h, pytest.raises(ValueError, match="inside"):
        await run_in_netns(h.fd, boom)


async def test_moves_are_sent_by_one_thread_in_the_order_asked(
    resolver: KernelNetnsResolver, netns: str
) -> None:
    # The kernel runs moves one at a time; sent from several threads they end in bunches.
    sent: list[tuple[int, int]] = []

    def move(k: int) -> None:
        sent.append((k, threading.get_ident()))

    with resolver.open(netns) as h:
        await asyncio.gather(*(move_from_netns(h.fd, functools.partial(move, k)) for k in range(8)))
    assert [k for k, _ in sent] == list(range(8))
    assert len({thread for _, thread in sent}) == 1
    assert sent[0][1] != threading.get_ident()  # not the event loop's thread


@pytest.fixture
def users_netns(root: None) -> Iterator[int]:
    """The pid of a process of uid 65534 (nobody) in a user namespace and a netns of its
    own (unshare), once they exist."""
    proc = subprocess.Popen(
        ["unshare", "--user", "--net", "--map-current-user", "sh", "-c", "echo ready; exec cat"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        user=65534,
        group=65534,
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline() == "ready\n"
        yield proc.pid
    finally:
        proc.kill()
        proc.wait()


def test_a_netns_is_its_user_namespace_owners(
    resolver: KernelNetnsResolver, netns: str, users_netns: int
) -> None:
    for spec, uid in ((netns, 0), (f"pid:{users_netns}", 65534)):
        with resolver.open(spec) as handle:
            assert owner_uid(handle.fd) == uid, spec


def open_as(resolver: KernelNetnsResolver, path: str, opening: str, owner: int) -> NetnsHandle:
    """`path` opened by the resolver, or adopted from an fd of ours (as ClaimFd does)."""
    if opening == "path":
        return resolver.open(path, owner)
    fd = os.open(path, os.O_RDONLY)
    try:
        return resolver.adopt_fd(fd, owner)
    finally:
        os.close(fd)


@pytest.mark.parametrize("opening", ["path", "fd"])
@pytest.mark.parametrize("whose", ["roots", "init_net"])
def test_an_owner_is_refused_a_netns_it_does_not_own(
    resolver: KernelNetnsResolver, netns: str, no_fd_leak: None, opening: str, whose: str
) -> None:
    # the test runs in init_net, as rdmad does
    path = f"/run/netns/{netns}" if whose == "roots" else f"/proc/{os.getpid()}/ns/net"
    with pytest.raises(AccessDenied, match="is not uid 65534's"):
        open_as(resolver, path, opening, 65534)


@pytest.mark.parametrize("opening", ["path", "fd"])
def test_an_owner_opens_its_own_netns(
    resolver: KernelNetnsResolver, users_netns: int, opening: str
) -> None:
    path = f"/proc/{users_netns}/ns/net"
    with open_as(resolver, path, opening, 65534) as handle:
        assert handle.inode == os.stat(path).st_ino
