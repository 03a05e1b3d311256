"""Validation of what a caller or the configuration may ask for (claim options, names,
addresses, the netns mode), checked before any kernel state is touched. Each check of a
value lives here once. The functions take plain Python values: which D-Bus type each claim
option must arrive in is the bus edge's check (rdmad.bus.objects.claim_options)."""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Sequence

from rdmad.errors import InvalidArgs
from rdmad.model import (
    DEFAULT_CHARDEVS,
    ChardevKind,
    Cidr,
    ClaimOptions,
    NetnsMode,
    RdmaLimit,
    Route,
)

OWNER_MAX_BYTES = 256
MTU_MIN, MTU_MAX = 68, 65535
# IFNAMSIZ is 16 with the NUL; the kernel also refuses "/", ":" and whitespace, "." and "..".
_IFNAME = re.compile(r"^[^/:\s\x00]{1,15}$")
# An extra CDI device name (the CDI spec's rule, kept to what CDI 0.5.0 readers accept).
_CDI_NAME = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9_.\-]{0,251}[A-Za-z0-9])?$")
# RDMA device names: what the kernel accepts for `rdma link add NAME` (IB_DEVICE_NAME_MAX 64).
_DEVNAME = re.compile(r"^[A-Za-z0-9_.\-]{1,63}$")


def check_ifname(name: str) -> str:
    if not _IFNAME.match(name) or name in (".", ".."):
        raise InvalidArgs(f"invalid interface name {name!r}: 1-15 bytes, no '/', ':' or spaces")
    if len(name.encode()) > 15:
        raise InvalidArgs(f"invalid interface name {name!r}: longer than 15 bytes")
    return name


def check_device_name(name: str) -> str:
    if not _DEVNAME.match(name):
        raise InvalidArgs(f"invalid RDMA device name {name!r}")
    return name


# The modes a caller or the configuration may ask for (UNAVAILABLE is only ever reported).
NETNS_MODES = (NetnsMode.SHARED.value, NetnsMode.EXCLUSIVE.value)


def parse_netns_mode(text: str) -> NetnsMode:
    if text not in NETNS_MODES:
        raise InvalidArgs(f"netns mode must be 'shared' or 'exclusive', not {text!r}")
    return NetnsMode(text)


def parse_cidr(text: str) -> Cidr:
    """An address with its prefix length, such as 192.0.2.10/24 or 2001:db8::5/64."""
    if "/" not in text:
        raise InvalidArgs(f"invalid address {text!r}: the prefix length is missing")
    try:
        return ipaddress.ip_interface(text)
    except ValueError:
        raise InvalidArgs(f"invalid address {text!r}: expected a CIDR like 192.0.2.10/24") from None


# Routing tables a claim may not take: the kernel's own (include/uapi/linux/rtnetlink.h).
RESERVED_TABLES = {253: "default", 254: "main", 255: "local"}
TABLE_MAX = 0xFFFFFFFF  # table ids are u32 (FRA_TABLE, RTA_TABLE)


def parse_table(value: int) -> int:
    """A claim's routing table: a number of its own, or TABLE_AUTO (0) for rdmad's pick."""
    if not 0 <= value <= TABLE_MAX:
        raise InvalidArgs(f"routing table {value} is out of range 1-{TABLE_MAX} (0: choose)")
    if value in RESERVED_TABLES:
        raise InvalidArgs(f"routing table {value} is the kernel's {RESERVED_TABLES[value]!r}")
    return value


def parse_table_range(text: str) -> range:
    """The tables rdmad picks from, as FIRST-LAST (the setting route_tables)."""
    first, sep, last = text.partition("-")
    if not sep or not first.strip().isdigit() or not last.strip().isdigit():
        raise InvalidArgs(f"routing table range {text!r} must be FIRST-LAST, e.g. 1000-1999")
    tables = range(int(first), int(last) + 1)
    if not tables or tables.start < 1 or tables.stop - 1 > TABLE_MAX:
        raise InvalidArgs(f"routing table range {text!r} is empty or out of 1-{TABLE_MAX}")
    if any(t in tables for t in RESERVED_TABLES):
        raise InvalidArgs(f"routing table range {text!r} holds the kernel's tables 253-255")
    return tables


def parse_route(text: str) -> Route:
    """A route as DST[,via=GW]: DST a network (a bare address is a host route)."""
    dst_text, *rest = text.split(",")
    try:
        dst = ipaddress.ip_network(dst_text.strip(), strict=True)
    except ValueError:
        raise InvalidArgs(f"invalid route {text!r}: {dst_text!r} is not a network") from None
    via = None
    for part in rest:
        key, _, value = part.strip().partition("=")
        if key != "via" or via is not None:
            raise InvalidArgs(f"invalid route {text!r}: expected DST[,via=GATEWAY]")
        try:
            via = ipaddress.ip_address(value)
        except ValueError:
            raise InvalidArgs(f"invalid route {text!r}: {value!r} is not an address") from None
    if via is not None and via.version != dst.version:
        raise InvalidArgs(f"invalid route {text!r}: the gateway is not of the route's family")
    return Route(dst, via)


def _check_routing(table: int | None, routes: tuple[Route, ...], cidrs: tuple[Cidr, ...]) -> None:
    """Policy routing needs the claim's addresses (its rules are `from` them), and a route
    must leave through them: its gateway on-link of one, or its family one they have."""
    if table is None:
        if routes:
            raise InvalidArgs("option 'routes' needs option 'table' (the claim's routing table)")
        return
    if not cidrs:
        raise InvalidArgs("option 'table' needs option 'addresses' (its rules match them)")
    for r in routes:
        if r.via is not None and not any(r.via in c.network for c in cidrs):
            raise InvalidArgs(
                f"route to {r.dst}: gateway {r.via} is on-link of none of the claim's "
                f"addresses ({', '.join(str(c) for c in cidrs)})"
            )
        if r.via is None and not any(c.version == r.dst.version for c in cidrs):
            raise InvalidArgs(f"route to {r.dst}: the claim has no IPv{r.dst.version} address")


# The kernel keeps rdma.max values as a non-negative int, `max` as S32_MAX
# (kernel/cgroup/rdma.c): a limit at or over it would read back as `max`, no limit.
RDMA_LIMIT_MAX = 2**31 - 2
CGROUP_MAX_BYTES = 4095  # PATH_MAX without its NUL


def parse_limit(
    cgroup: str, hca_handles: int | None, hca_objects: int | None
) -> tuple[str, RdmaLimit | None]:
    """A claim's cgroup and its rdma.max line for the claim's device. The cgroup's place
    in the cgroup2 mount is the kernel adapter's to check (rdmad.kernel.cgroup)."""
    if "\x00" in cgroup or len(cgroup.encode("utf-8", "surrogatepass")) > CGROUP_MAX_BYTES:
        raise InvalidArgs(f"invalid cgroup {cgroup!r}: a path of at most {CGROUP_MAX_BYTES} bytes")
    for name, value in (("hca_handles", hca_handles), ("hca_objects", hca_objects)):
        if value is not None and not 0 <= value <= RDMA_LIMIT_MAX:
            raise InvalidArgs(f"{name} {value} is out of range 0-{RDMA_LIMIT_MAX}")
    if hca_handles is None and hca_objects is None:
        return cgroup, None
    if not cgroup:
        raise InvalidArgs("options 'hca_handles' and 'hca_objects' need option 'cgroup'")
    return cgroup, RdmaLimit(hca_handles, hca_objects)


def parse_chardevs(chardevs: Sequence[str]) -> tuple[ChardevKind, ...]:
    kinds: list[ChardevKind] = []
    for kind in chardevs:
        try:
            parsed = ChardevKind(kind)
        except ValueError:
            known = ", ".join(k.value for k in ChardevKind)
            raise InvalidArgs(f"unknown char device kind {kind!r} (known: {known})") from None
        if parsed not in kinds:
            kinds.append(parsed)
    return tuple(kinds)


def _check_cdi_names(cdi_name: str, pod_cdi_name: str) -> None:
    for what, name in (("CDI name", cdi_name), ("pod CDI name", pod_cdi_name)):
        if name and not _CDI_NAME.match(name):
            raise InvalidArgs(
                f"invalid {what} {name!r}: letters, digits, '_', '-' and '.', "
                "starting and ending with a letter or digit"
            )
    if pod_cdi_name and pod_cdi_name == cdi_name:
        raise InvalidArgs(f"CDI name {cdi_name!r} cannot name the claim and its pod")


def parse_claim_options(
    *,
    ifname: str | None = None,
    mtu: int | None = None,
    addresses: Sequence[str] = (),
    shared: bool = False,
    chardevs: Sequence[str] = DEFAULT_CHARDEVS,
    owner: str = "",
    netdev: bool | None = None,
    cdi_name: str = "",
    pod_cdi_name: str = "",
    table: int | None = None,
    routes: Sequence[str] = (),
    cgroup: str = "",
    hca_handles: int | None = None,
    hca_objects: int | None = None,
) -> ClaimOptions:
    """A caller's claim options, each given as its plain value (or left out), as validated
    ClaimOptions; InvalidArgs on any value rdmad cannot take."""
    if mtu is not None and not MTU_MIN <= mtu <= MTU_MAX:
        raise InvalidArgs(f"mtu {mtu} is out of range {MTU_MIN}-{MTU_MAX}")
    if len(owner.encode("utf-8", "surrogatepass")) > OWNER_MAX_BYTES:
        raise InvalidArgs(f"owner is longer than {OWNER_MAX_BYTES} bytes")
    if "\x00" in owner:
        raise InvalidArgs("owner must not contain NUL")
    cidrs = tuple(parse_cidr(a) for a in addresses)
    if shared and netdev is not None:
        raise InvalidArgs("option 'netdev' applies to whole-device claims only")
    _check_cdi_names(cdi_name, pod_cdi_name)
    if table is not None:
        table = parse_table(table)
        if not (netdev is None or netdev):
            raise InvalidArgs("option 'table' needs the claim's netdev (netdev=false moves none)")
    parsed_routes = tuple(parse_route(r) for r in routes)
    _check_routing(table, parsed_routes, cidrs)
    cgroup, limit = parse_limit(cgroup, hca_handles, hca_objects)
    return ClaimOptions(
        ifname=check_ifname(ifname) if ifname is not None else None,
        mtu=mtu,
        addresses=cidrs,
        shared=shared,
        chardevs=parse_chardevs(chardevs),
        owner=owner,
        netdev=True if netdev is None else netdev,
        cdi_name=cdi_name,
        pod_cdi_name=pod_cdi_name,
        table=table,
        routes=parsed_routes,
        cgroup=cgroup,
        limit=limit,
    )
