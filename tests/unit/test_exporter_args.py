"""rdmad-exporter's command line and metric naming."""

from __future__ import annotations

import argparse

import pytest

from rdmad.exporter import listen_address, metric_name, parse_args


def test_default_listen_address_is_every_address_on_9879() -> None:
    assert parse_args([]).listen_address == ("0.0.0.0", 9879)


@pytest.mark.parametrize(
    ("text", "expected"),
    [("127.0.0.1:9000", ("127.0.0.1", 9000)), ("[::1]:9879", ("::1", 9879))],
)
def test_listen_address_takes_host_and_port(text: str, expected: tuple[str, int]) -> None:
    assert listen_address(text) == expected


@pytest.mark.parametrize("text", ["9879", "host:", "host:http", ":70000"])
def test_a_listen_address_without_a_valid_port_is_refused(text: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError):
        listen_address(text)


def test_kernel_counter_names_become_metric_names() -> None:
    assert metric_name("sent_pkts") == "rdmad_port_sent_pkts"
    assert metric_name("np_cnp-sent.x") == "rdmad_port_np_cnp_sent_x"
