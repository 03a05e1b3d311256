"""Validation of what a caller or the configuration may ask for (claim options, names,
addresses, the netns mode), checked before any kernel state is touched. Each check lives
here once."""

from __future__ import annotations

import ipaddress
import re

from rdmad.errors import InvalidArgs
from rdmad.model import ChardevKind, ClaimOptions, NetnsMode

Cidr = ipaddress.IPv4Interface | ipaddress.IPv6Interface

# D-Bus signature each option must carry; anything else is InvalidArgs.
OPTION_SIGNATURES: dict[str, str] = {
    "ifname": "s",
    "mtu": "u",
    "addresses": "as",
    "shared": "b",
    "chardevs": "as",
    "owner": "s",
    "netdev": "b",
    "cdi_name": "s",
}

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


def parse_claim_options(raw: dict[str, tuple[str, object]]) -> ClaimOptions:
    """Turn {name: (signature, value)} into ClaimOptions, or raise InvalidArgs."""
    for name, (signature, _) in raw.items():
        want = OPTION_SIGNATURES.get(name)
        if want is None:
            known = ", ".join(sorted(OPTION_SIGNATURES))
            raise InvalidArgs(f"unknown claim option {name!r} (known: {known})")
        if signature != want:
            raise InvalidArgs(f"claim option {name!r} must be of type '{want}', not '{signature}'")
    values = {name: value for name, (_, value) in raw.items()}

    ifname = values.get("ifname")
    mtu = values.get("mtu")
    if isinstance(mtu, int) and not MTU_MIN <= mtu <= MTU_MAX:
        raise InvalidArgs(f"mtu {mtu} is out of range {MTU_MIN}-{MTU_MAX}")
    owner = str(values.get("owner", ""))
    if len(owner.encode("utf-8", "surrogatepass")) > OWNER_MAX_BYTES:
        raise InvalidArgs(f"owner is longer than {OWNER_MAX_BYTES} bytes")
    if "\x00" in owner:
        raise InvalidArgs("owner must not contain NUL")
    raw_addresses = _as_list(values.get("addresses", []))
    addresses = tuple(parse_cidr(str(a)).with_prefixlen for a in raw_addresses)
    kinds: list[ChardevKind] = []
    for kind in _as_list(values.get("chardevs", ["uverbs", "rdma_cm"])):
        try:
            parsed = ChardevKind(kind)
        except ValueError:
            known = ", ".join(k.value for k in ChardevKind)
            raise InvalidArgs(f"unknown char device kind {kind!r} (known: {known})") from None
        if parsed not in kinds:
            kinds.append(parsed)
    shared = bool(values.get("shared", False))
    netdev = bool(values.get("netdev", True))
    if shared and "netdev" in values:
        raise InvalidArgs("option 'netdev' applies to whole-device claims only")
    cdi_name = str(values.get("cdi_name", ""))
    if cdi_name and not _CDI_NAME.match(cdi_name):
        raise InvalidArgs(
            f"invalid CDI name {cdi_name!r}: letters, digits, '_', '-' and '.', "
            "starting and ending with a letter or digit"
        )
    return ClaimOptions(
        ifname=check_ifname(str(ifname)) if ifname is not None else None,
        mtu=int(mtu) if isinstance(mtu, int) else None,
        addresses=addresses,
        shared=shared,
        chardevs=tuple(kinds),
        owner=owner,
        netdev=netdev,
        cdi_name=cdi_name,
    )


def _as_list(value: object) -> list[str]:
    if not isinstance(value, list | tuple):
        raise InvalidArgs("expected an array of strings")
    return [str(v) for v in value]
