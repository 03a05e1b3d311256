"""The policy-routing claim options (table, routes) and the route_tables setting: each
value rdmad cannot take is an InvalidArgs that says what is wrong, before the kernel."""

from __future__ import annotations

from ipaddress import ip_address, ip_network

import pytest

from rdmad.daemon.config import ConfigError, load
from rdmad.errors import InvalidArgs
from rdmad.model import TABLE_AUTO, Route
from rdmad.options import parse_claim_options, parse_route, parse_table_range

ADDRS = ["10.0.0.5/24", "2001:db8::5/64"]


def test_a_route_is_a_destination_with_an_optional_gateway() -> None:
    assert parse_route("10.9.0.0/16,via=10.0.0.1") == Route(
        ip_network("10.9.0.0/16"), ip_address("10.0.0.1")
    )
    assert parse_route("2001:db8:9::/48") == Route(ip_network("2001:db8:9::/48"))


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("10.9.0.1/16", "is not a network"),
        ("10.9.0.0/16,via=nowhere", "is not an address"),
        ("10.9.0.0/16,dev=eth0", "expected DST"),
        ("10.9.0.0/16,via=2001:db8::1", "not of the route's family"),
    ],
)
def test_a_malformed_route_is_refused(text: str, why: str) -> None:
    with pytest.raises(InvalidArgs, match=why):
        parse_route(text)


def test_table_and_routes_are_parsed_into_the_claim_options() -> None:
    opts = parse_claim_options(addresses=ADDRS, table=TABLE_AUTO, routes=["0.0.0.0/0,via=10.0.0.1"])
    assert opts.table == TABLE_AUTO
    assert opts.routes == (Route(ip_network("0.0.0.0/0"), ip_address("10.0.0.1")),)


def test_a_gateway_on_link_of_none_of_the_addresses_is_refused() -> None:
    with pytest.raises(InvalidArgs, match=r"gateway 10\.1\.0\.1 is on-link of none"):
        parse_claim_options(addresses=ADDRS, table=1000, routes=["10.9.0.0/16,via=10.1.0.1"])


def test_an_on_link_route_of_a_family_the_claim_has_no_address_of_is_refused() -> None:
    with pytest.raises(InvalidArgs, match="has no IPv6 address"):
        parse_claim_options(addresses=["10.0.0.5/24"], table=1000, routes=["2001:db8:9::/48"])


@pytest.mark.parametrize(
    ("options", "why"),
    [
        ({"table": 1000}, "needs option 'addresses'"),
        ({"addresses": ADDRS, "routes": ["10.9.0.0/16"]}, "needs option 'table'"),
        ({"addresses": ADDRS, "table": 254}, "the kernel's 'main'"),
        ({"addresses": ADDRS, "table": 255}, "the kernel's 'local'"),
        ({"addresses": ADDRS, "table": 1000, "netdev": False}, "needs the claim's netdev"),
    ],
)
def test_policy_routing_options_that_cannot_work_are_refused(
    options: dict[str, object], why: str
) -> None:
    with pytest.raises(InvalidArgs, match=why):
        parse_claim_options(**options)  # type: ignore[arg-type]


def test_the_table_range_is_first_to_last_inclusive() -> None:
    assert parse_table_range("1000-1999") == range(1000, 2000)


@pytest.mark.parametrize("text", ["1000", "2000-1000", "200-300", "0-10", "a-b"])
def test_a_table_range_that_is_empty_malformed_or_holds_the_kernels_tables_is_refused(
    text: str,
) -> None:
    with pytest.raises(InvalidArgs):
        parse_table_range(text)


def test_the_default_range_avoids_the_tables_spiderpool_and_dranet_use() -> None:
    tables = parse_table_range(load([]).route_tables)
    assert not set(tables) & set(range(100, 200)) and len(tables) == 1000


def test_a_bad_route_tables_setting_stops_the_start() -> None:
    with pytest.raises(ConfigError, match="route_tables"):
        load(["--route-tables", "5"])
