"""Claim options, the netns mode and addresses: what callers may ask for, refused with
InvalidArgs before anything moves."""

from __future__ import annotations

from ipaddress import ip_interface
from typing import Any

import pytest

from rdmad.errors import InvalidArgs
from rdmad.model import ChardevKind, ClaimOptions, NetnsMode
from rdmad.options import (
    check_device_name,
    check_ifname,
    parse_cidr,
    parse_claim_options,
    parse_netns_mode,
)


def test_no_options_gives_the_contract_defaults() -> None:
    assert parse_claim_options() == ClaimOptions()
    assert ClaimOptions().chardevs == (ChardevKind.UVERBS, ChardevKind.RDMA_CM)


def test_all_options_parse() -> None:
    parsed = parse_claim_options(
        ifname="net0",
        mtu=9000,
        addresses=["10.0.0.5/24", "2001:db8::5/64"],
        chardevs=["uverbs", "umad", "uverbs"],
        owner="ctr",
        netdev=False,
    )
    assert parsed == ClaimOptions(
        ifname="net0",
        mtu=9000,
        addresses=(ip_interface("10.0.0.5/24"), ip_interface("2001:db8::5/64")),
        chardevs=(ChardevKind.UVERBS, ChardevKind.UMAD),
        owner="ctr",
        netdev=False,
    )


@pytest.mark.parametrize(
    ("options", "says"),
    [
        ({"mtu": 67}, "out of range"),
        ({"addresses": ["10.0.0.5"]}, "prefix length"),
        ({"addresses": ["10.0.0.300/24"]}, "invalid address"),
        ({"chardevs": ["nvme"]}, "unknown char device kind"),
        ({"owner": "x" * 257}, "256 bytes"),
        ({"owner": "a\x00b"}, "NUL"),
        ({"shared": True, "netdev": False}, "whole-device claims only"),
        ({"shared": True, "netdev": True}, "whole-device claims only"),
    ],
)
def test_bad_options_are_invalid_args(options: dict[str, Any], says: str) -> None:
    with pytest.raises(InvalidArgs, match=says):
        parse_claim_options(**options)


@pytest.mark.parametrize("name", ["", "a" * 16, "a/b", "a:b", "a b", ".", "..", "é" * 8])
def test_bad_interface_names(name: str) -> None:
    with pytest.raises(InvalidArgs):
        check_ifname(name)


def test_device_names_allow_kernel_style_names() -> None:
    assert check_device_name("mlx5_0") == "mlx5_0"
    with pytest.raises(InvalidArgs):
        check_device_name("../x")


def test_cdi_name_is_kept() -> None:
    assert parse_claim_options(cdi_name="web.eth0").cdi_name == "web.eth0"


@pytest.mark.parametrize("name", ["-web", "web.", "a b", "web/eth0", "x" * 254])
def test_invalid_cdi_name_is_refused(name: str) -> None:
    with pytest.raises(InvalidArgs, match="CDI name"):
        parse_claim_options(cdi_name=name)


@pytest.mark.parametrize("text", ["shared", "exclusive"])
def test_a_netns_mode_a_caller_may_ask_for_parses(text: str) -> None:
    assert parse_netns_mode(text) == NetnsMode(text)


@pytest.mark.parametrize("text", ["unavailable", "promiscuous", "", "Shared"])
def test_any_other_netns_mode_is_invalid_args(text: str) -> None:
    with pytest.raises(InvalidArgs, match="netns mode must be 'shared' or 'exclusive'"):
        parse_netns_mode(text)


@pytest.mark.parametrize(
    ("text", "says"),
    [("10.0.0.5", "prefix length is missing"), ("10.0.0.300/24", "expected a CIDR")],
)
def test_an_address_without_a_valid_prefix_is_invalid_args(text: str, says: str) -> None:
    with pytest.raises(InvalidArgs, match=says):
        parse_cidr(text)


def test_an_address_keeps_its_host_part_and_prefix() -> None:
    assert str(parse_cidr("2001:db8::5/64")) == "2001:db8::5/64"


def test_claim_addresses_are_parsed_once_into_canonical_interfaces() -> None:
    # the backends take these as they are: nothing after parse_claim_options parses again
    parsed = parse_claim_options(addresses=["10.0.0.5/255.255.255.0", "2001:DB8:0::5/64"])
    assert parsed.addresses == (ip_interface("10.0.0.5/24"), ip_interface("2001:db8::5/64"))
    assert [a.with_prefixlen for a in parsed.addresses] == ["10.0.0.5/24", "2001:db8::5/64"]
