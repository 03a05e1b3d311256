"""A device's GID table, read from sysfs as a claimant's netns sees it.

RDMA netlink has no GID table; sysfs has it, per port: ports/N/gids/I (the GID),
gid_attrs/types/I ("IB/RoCE v1", "RoCE v2") and gid_attrs/ndevs/I (the netdev's name).
The infiniband class is tagged by netns: a sysfs shows the RDMA devices of the netns it was
mounted from, so a device moved into a claimant's netns is read through a sysfs mounted from
there. fsopen/fsmount make that mount detached (no mount namespace is touched) and it is
closed after the read, so nothing keeps the netns.

The kernel fills the table from a workqueue after a netdev's address or the device itself
appears, and announces nothing when it has: a read that must see a netdev's addresses reads
again, briefly, until their GIDs are in.
"""

from __future__ import annotations

import asyncio
import ctypes
import functools
import logging
import os
import time
from collections.abc import Awaitable, Callable

from rdmad.core.backend import NetnsTarget, Placement
from rdmad.kernel.netlink import NetlinkError, kernel_error
from rdmad.kernel.netns import run_in_netns
from rdmad.kernel.nlsocket import NlChannel
from rdmad.kernel.rtnl_msgs import addresses
from rdmad.model import Cidr, Gid, gid_of

log = logging.getLogger(__name__)

ZERO_GID = "0000:0000:0000:0000:0000:0000:0000:0000"
# How long the kernel's GID workqueue may lag behind an address or a move: a bound, reached
# only if the entries never come; the first pause between reads (doubled each time, to 0.2 s).
SETTLE_S = 10.0
FIRST_PAUSE_S = 0.005

# <linux/mount.h>; the syscall numbers are the same on every architecture since 5.2.
_SYS_FSOPEN, _SYS_FSCONFIG, _SYS_FSMOUNT = 430, 431, 432
_FSOPEN_CLOEXEC, _FSMOUNT_CLOEXEC, _FSCONFIG_CMD_CREATE = 1, 1, 6
_MOUNT_ATTR = 0x1 | 0x2 | 0x4 | 0x8  # RDONLY NOSUID NODEV NOEXEC
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC


@functools.cache
def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


def _syscall(number: int, *args: object) -> int:
    ret = int(_libc().syscall(number, *args))
    if ret < 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))
    return ret


def mount_sysfs() -> int:
    """A detached, read-only sysfs of the calling thread's netns, as a directory fd."""
    fs = _syscall(_SYS_FSOPEN, b"sysfs", _FSOPEN_CLOEXEC)
    try:
        _syscall(_SYS_FSCONFIG, fs, _FSCONFIG_CMD_CREATE, None, None, 0)
        return _syscall(_SYS_FSMOUNT, fs, _FSMOUNT_CLOEXEC, _MOUNT_ATTR)
    finally:
        os.close(fs)


def _read(path: str, root: int) -> str | None:
    """A sysfs attribute, or None when the kernel refuses it (an empty GID entry's type)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC, dir_fd=root)
    except FileNotFoundError:
        return None
    try:
        return os.read(fd, 256).decode().strip()
    except OSError:
        return None
    finally:
        os.close(fd)


def _listdir(path: str, root: int) -> list[str]:
    fd = os.open(path, _DIR_FLAGS, dir_fd=root)
    try:
        return os.listdir(fd)
    finally:
        os.close(fd)


def read_table(device: str, root: int) -> tuple[Gid, ...]:
    """Every used entry of every port of `device`, from the sysfs open at `root`.

    Raises FileNotFoundError when that sysfs does not show the device."""
    base = f"class/infiniband/{device}/ports"
    out: list[Gid] = []
    for port in sorted(_listdir(base, root), key=int):
        where = f"{base}/{port}"
        indexes = sorted(map(int, _listdir(f"{where}/gids", root)))
        for index in indexes:
            gid = _read(f"{where}/gids/{index}", root)
            if not gid or gid == ZERO_GID:
                continue
            kind = _read(f"{where}/gid_attrs/types/{index}", root)
            if kind is None:  # removed while we read
                continue
            netdev = _read(f"{where}/gid_attrs/ndevs/{index}", root) or ""
            out.append(Gid(int(port), index, gid, kind, netdev))
    return tuple(out)


def _table_in_netns(device: str) -> tuple[Gid, ...]:
    root = mount_sysfs()
    try:
        return read_table(device, root)
    finally:
        os.close(root)


def _table_in_init_net(device: str) -> tuple[Gid, ...]:
    root = os.open("/sys", _DIR_FLAGS)  # this process's sysfs: init_net's
    try:
        return read_table(device, root)
    finally:
        os.close(root)


async def _table(device: str, inside: NetnsTarget | None) -> tuple[Gid, ...]:
    where = inside.path if inside is not None else "init_net"
    try:
        if inside is None:
            return await asyncio.to_thread(_table_in_init_net, device)
        return await run_in_netns(inside.fd, lambda: _table_in_netns(device))
    except FileNotFoundError:
        return ()  # gone meanwhile, or no ports: a claim still stands without GIDs
    except OSError as e:
        raise kernel_error(e, f"reading the GID table of {device} in {where}") from e


async def addresses_of(rtnl: NlChannel, netdev: Placement) -> list[Cidr]:
    """The addresses of a placed netdev, read through init_net's rtnetlink channel `rtnl` by
    its netns's nsid (IFA_TARGET_NETNSID): no socket in that netns, no thread to make one."""
    try:
        return await addresses(rtnl, netdev.ifindex, target_nsid=netdev.nsid)
    except NetlinkError as e:
        what = f"reading the addresses of {netdev.ifname} (netns id {netdev.nsid})"
        raise kernel_error(e, what) from e


async def claim_gids(
    device: str,
    inside: NetnsTarget | None,
    netdev: Placement | None,
    rtnl: NlChannel,
) -> tuple[Gid, ...]:
    """The entries of `device`'s table a claim gets: all of them, or with `netdev` (a netdev
    in `inside`) those of its addresses; names repeat across netns, so an entry is the
    netdev's when both its name and its GID match. Waits (bounded) for the kernel to fill
    in the entries of every address, or, for the whole table, any entry. IPv6 addresses
    are no exception: the kernel queues their entries when the address is made, tentative
    or not (DAD is not waited for)."""
    if netdev is None:
        return await _settled(lambda: _table(device, inside), lambda g: g, None, device)
    assert inside is not None
    cidrs = await addresses_of(rtnl, netdev)
    need = {gid_of(c.ip) for c in cidrs}
    if not need:
        return ()  # no addresses, so no entries of its own to wait for

    def mine(gids: tuple[Gid, ...]) -> tuple[Gid, ...]:
        return tuple(g for g in gids if g.netdev == netdev.ifname and g.gid in need)

    return await _settled(lambda: _table(device, inside), mine, need, device)


async def _settled(
    read: Callable[[], Awaitable[tuple[Gid, ...]]],
    mine: Callable[[tuple[Gid, ...]], tuple[Gid, ...]],
    need: set[str] | None,
    device: str,
) -> tuple[Gid, ...]:
    """Read until every needed GID is in (None: until any entry is mine)."""
    deadline = time.monotonic() + SETTLE_S
    pause = FIRST_PAUSE_S
    while True:
        gids = mine(await read())
        missing = set() if need is None else need - {g.gid for g in gids}
        if (bool(gids) if need is None else not missing) or time.monotonic() >= deadline:
            if missing:
                log.warning("%s: no GID yet for %s", device, ", ".join(sorted(missing)))
            return gids
        # Nothing announces the kernel's GID work: re-read after a growing pause.
        await asyncio.sleep(pause)
        pause = min(pause * 2, 0.2)
