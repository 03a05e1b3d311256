"""Whether a claim or a hold may be made: what the claims on record and the device allow.
Reads only; the core asks under the device's lock."""

from __future__ import annotations

import itertools

from rdmad.core.claims import ClaimBook
from rdmad.errors import DeviceBusy, InvalidArgs, NotSupported
from rdmad.model import ClaimOptions, NetnsMode, RdmaDevice


def check_claim(
    book: ClaimBook,
    dev: RdmaDevice,
    has_netdev: bool,
    mode: NetnsMode,
    shared_limit: int,
    inode: int,
    opts: ClaimOptions,
) -> None:
    """`inode`: the claimant's netns, 0 for a Hold (no netns yet); `has_netdev`: whether
    init_net has the device's netdev."""
    named = [c for c in book.claims.values() if opts.cdi_name and c.cdi_name == opts.cdi_name]
    if named:
        # Two specs naming one CDI device make runtimes refuse both.
        raise InvalidArgs(f"CDI name {opts.cdi_name!r} is taken by claim {named[0].id}")
    _check_pod_cdi_name(book, inode, opts)
    if opts.shared:
        _check_shared(book, dev, has_netdev, mode, shared_limit, inode)
    else:
        _check_whole(book, dev, has_netdev, mode, opts)


def _check_shared(
    book: ClaimBook,
    dev: RdmaDevice,
    has_netdev: bool,
    mode: NetnsMode,
    shared_limit: int,
    inode: int,
) -> None:
    mine = book.of(dev.name)
    if mode == NetnsMode.EXCLUSIVE:
        raise NotSupported(
            f"{dev.name}: shared claims need the RDMA subsystem in shared mode; "
            "it is in exclusive mode"
        )
    if any(not c.shared for c in mine):
        raise DeviceBusy(f"{dev.name} is claimed whole by claim {mine[0].id}")
    if inode and any(c.netns_inode == inode for c in mine):
        raise DeviceBusy(f"{dev.name} is already shared with {mine[0].netns}")
    if len(mine) >= shared_limit:
        raise DeviceBusy(f"{dev.name} has {len(mine)} shared claims, the limit ({shared_limit})")
    if not has_netdev:
        raise NotSupported(f"{dev.name} has no netdev to share a macvlan child of")


def _check_whole(
    book: ClaimBook, dev: RdmaDevice, has_netdev: bool, mode: NetnsMode, opts: ClaimOptions
) -> None:
    mine = book.of(dev.name)
    if mine:
        raise DeviceBusy(f"{dev.name} is held by claim {mine[0].id} ({mine[0].netns})")
    if not opts.netdev:
        if mode != NetnsMode.EXCLUSIVE:
            raise NotSupported(
                f"{dev.name}: moving only the RDMA device needs the RDMA subsystem in "
                "exclusive netns mode; it is in shared mode (switch it to exclusive first)"
            )
        return
    if dev.virtual:
        raise NotSupported(
            f"{dev.name} is a software RDMA device ({dev.driver}): moving its netdev "
            f"{dev.netdev or '(none)'} would destroy it. Claim it with netdev=false "
            "(exclusive mode) or make a shared claim instead"
        )
    if not has_netdev:
        raise NotSupported(f"{dev.name} has no netdev in init_net to move")


def _check_pod_cdi_name(book: ClaimBook, inode: int, opts: ClaimOptions) -> None:
    """A pod CDI name names one spec, of one netns's claims (a netns may have several,
    each listing all of them), and no claim's cdi_name: two specs naming one CDI device
    make runtimes refuse both."""
    for c in book.claims.values():
        if opts.cdi_name and c.pod_cdi_name == opts.cdi_name:
            raise InvalidArgs(f"CDI name {opts.cdi_name!r} is the pod CDI name of claim {c.id}")
        if not opts.pod_cdi_name:
            continue
        if c.cdi_name == opts.pod_cdi_name:
            raise InvalidArgs(f"pod CDI name {opts.pod_cdi_name!r} is the CDI name of claim {c.id}")
        if c.pod_cdi_name == opts.pod_cdi_name and c.netns_inode != inode:
            raise InvalidArgs(
                f"pod CDI name {opts.pod_cdi_name!r} is taken by claim {c.id} in {c.netns}"
            )
    if opts.pod_cdi_name and not inode:
        raise InvalidArgs("option 'pod_cdi_name' needs the pod's netns: give it to Attach")


def free_hold_ifname(book: ClaimBook, pod_uid: str) -> str:
    """A shared hold's default name: the first of net1, net2, ... that none of the pod's
    other holds has, so that a pod's shares, all attached into one netns, never clash."""
    taken = {c.ifname for c in book.held_for(pod_uid)}
    return next(f"net{n}" for n in itertools.count(1) if f"net{n}" not in taken)
