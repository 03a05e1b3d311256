"""rdmad-exporter's command line and metric naming."""

from __future__ import annotations

import argparse
import socket

import pytest

from rdmad.exporter.main import listen_address, main, metric_name, parse_args


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


@pytest.mark.parametrize("address", ["foo", "/run/dbus/system_bus_socket"])
def test_a_bus_address_that_is_not_one_is_refused_at_start(
    address: str, capsys: pytest.CaptureFixture[str]
) -> None:
    # served anyway, every scrape would fail with HTTP 500
    with pytest.raises(SystemExit) as exc:
        parse_args(["--bus-address", address])
    assert exc.value.code == 2
    assert f"--bus-address: {address!r} is not a D-Bus address" in capsys.readouterr().err


def test_a_malformed_system_bus_variable_is_refused_at_start(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DBUS_SYSTEM_BUS_ADDRESS", "foo")
    with pytest.raises(SystemExit) as exc:
        parse_args([])
    assert exc.value.code == 2
    assert "$DBUS_SYSTEM_BUS_ADDRESS: 'foo'" in capsys.readouterr().err


def test_a_listen_address_in_use_exits_1_with_one_line_naming_it(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        argv = ["--listen-address", f"127.0.0.1:{port}", "--bus-address", "unix:path=/nowhere"]
        assert main(argv) == 1
    assert capsys.readouterr().err == (
        f"rdmad-exporter: cannot serve on 127.0.0.1:{port}: Address already in use\n"
    )
