"""rdmactl's command line: global options wherever users type them, and usage errors."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from rdmad import __version__
from rdmad.cli.main import COMMANDS, build_parser, cmd_claim, main, parse_args
from tests.cli.fake_client import FakeClient

BUS = "unix:path=/run/example/bus"

# A subcommand and the arguments it needs, for every subcommand rdmactl has.
INVOCATIONS = {
    "status": [],
    "list": [],
    "claims": [],
    "show": ["mlx5_0"],
    "claim": ["mlx5_0", "pod1", "--shared"],
    "release": ["3f2a9c0011223344"],
    "mode": ["exclusive"],
    "monitor": [],
    "stats": ["mlx5_0", "--watch", "--interval", "0.5"],
}


def test_every_subcommand_has_an_invocation_here() -> None:
    assert set(INVOCATIONS) == set(COMMANDS)


GLOBAL = ["--json", "--bus-address", BUS, "--timeout", "5"]


@pytest.mark.parametrize("command", sorted(INVOCATIONS))
def test_global_options_before_the_subcommand(command: str) -> None:
    args = parse_args([*GLOBAL, command, *INVOCATIONS[command]])
    assert (args.command, args.json, args.bus_address, args.timeout) == (command, True, BUS, 5)


@pytest.mark.parametrize("command", sorted(INVOCATIONS))
def test_global_options_after_the_subcommand(command: str) -> None:
    args = parse_args([command, *INVOCATIONS[command], *GLOBAL])
    assert (args.command, args.json, args.bus_address, args.timeout) == (command, True, BUS, 5)


def test_global_options_between_the_subcommand_and_its_arguments() -> None:
    args = parse_args(["claim", "--json", "mlx5_0", "--bus-address", BUS, "pod1", "--shared"])
    assert (args.json, args.bus_address, args.device, args.netns, args.shared) == (
        True,
        BUS,
        "mlx5_0",
        "pod1",
        True,
    )


def test_global_options_split_around_the_subcommand() -> None:
    args = parse_args(["--bus-address", BUS, "list", "--json"])
    assert (args.json, args.bus_address) == (True, BUS)


def test_an_option_given_before_is_not_reset_by_the_subcommand() -> None:
    args = parse_args(["--json", "--bus-address", BUS, "claims"])
    assert (args.json, args.bus_address) == (True, BUS)


def test_without_global_options_the_defaults_hold() -> None:
    args = parse_args(["list"])
    assert (args.json, args.bus_address, args.timeout) == (False, None, 25)


def test_the_option_given_last_wins() -> None:
    args = parse_args(["--bus-address", "unix:path=/a", "list", "--bus-address", BUS])
    assert args.bus_address == BUS


def test_claim_options_parse_repeatable_flags() -> None:
    args = parse_args(
        [
            "claim",
            "mlx5_0",
            "ns1",
            "--address",
            "192.0.2.1/24",
            "--address",
            "2001:db8::1/64",
            "--chardev",
            "umad",
        ]
    )
    assert args.address == ["192.0.2.1/24", "2001:db8::1/64"] and args.chardev == ["umad"]


def test_claim_takes_a_pod_cdi_name() -> None:
    args = parse_args(["claim", "mlx5_0", "ns1", "--pod-cdi-name", "pod1"])
    assert args.pod_cdi_name == "pod1"


async def test_claim_sends_a_cgroup_and_its_limits_as_claim_options() -> None:
    limits = ["--cgroup", "kubepods/pod1", "--hca-handles", "1", "--hca-objects", "3"]
    args = parse_args(["claim", "mlx5_0", "ns1", *limits])
    client = FakeClient({"Claim": ["/io/rdmad1/claim/c1"], "GetAll": [{}]})
    await cmd_claim(client, args, io.StringIO())
    ((_, (_, _, options)), _) = client.calls
    assert {k: (v.signature, v.value) for k, v in options.items()} == {
        "cgroup": ("s", "kubepods/pod1"),
        "hca_handles": ("u", 1),
        "hca_objects": ("u", 3),
    }


def test_a_relative_netns_path_is_made_absolute_against_the_current_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # rdmad resolves paths in its own directory, which is not the user's
    monkeypatch.chdir(tmp_path)
    assert parse_args(["claim", "mlx5_0", "./ns/pod1"]).netns == str(tmp_path / "ns" / "pod1")


@pytest.mark.parametrize("netns", ["pod1", "pid:4242", "/run/netns/pod1", "/proc/4242/ns/net"])
def test_a_netns_name_pid_or_absolute_path_is_passed_as_typed(netns: str) -> None:
    assert parse_args(["claim", "mlx5_0", netns]).netns == netns


def usage_error(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    with pytest.raises(SystemExit) as exc:
        parse_args(argv)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("usage: rdmactl")
    return err.splitlines()[-1]


def test_unknown_command_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert "frobnicate" in usage_error(["frobnicate"], capsys)


@pytest.mark.parametrize(
    "argv", [["list", "extra"], ["list", "--jsno"], ["--jsno", "list"], ["list", "--", "x"]]
)
def test_a_stray_argument_is_the_subcommands_usage_error(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    line = usage_error(argv, capsys)
    assert line.startswith("rdmactl list: error: unrecognized arguments:")


def test_a_stray_argument_shows_the_subcommands_usage(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit):
        parse_args(["claims", "extra"])
    assert capsys.readouterr().err.startswith("usage: rdmactl claims [-h]")


def test_version_prints_rdmactls_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        parse_args(["--version"])
    assert exc.value.code == 0
    assert capsys.readouterr().out == f"rdmactl {__version__}\n"


def test_a_missing_argument_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert "netns" in usage_error(["claim", "mlx5_0"], capsys)


@pytest.mark.parametrize("mtu", ["-1", "4294967296", "big"])
def test_an_mtu_that_is_not_a_uint32_is_a_usage_error(
    mtu: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert "--mtu" in usage_error(["claim", "mlx5_0", "pod1", "--mtu", mtu], capsys)


def test_an_argument_that_is_not_utf8_is_a_usage_error(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # What Python makes of the byte 0xff in argv; D-Bus strings must be UTF-8.
    assert "not valid UTF-8" in usage_error(["show", "mlx\udcff"], capsys)


@pytest.mark.parametrize("command", sorted(INVOCATIONS))
def test_each_subcommands_help_lists_the_global_options(
    command: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exc:
        build_parser().parse_args([command, "--help"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    assert "--json" in out and "--bus-address" in out and "--timeout" in out


def test_main_help_names_every_subcommand_and_the_exit_codes(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit):
        build_parser().parse_args(["--help"])
    out = capsys.readouterr().out
    assert all(command in out for command in COMMANDS)
    assert "exit status" in out and "before or after the command" in out


@pytest.mark.parametrize(
    "argv",
    [
        ["--bus-address", "unix:path=/nonexistent/bus", "status"],
        ["status", "--bus-address", "unix:path=/nonexistent/bus"],
    ],
)
def test_unreachable_daemon_exits_3_with_one_line_and_a_hint(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(argv) == 3
    captured = capsys.readouterr()
    assert captured.out == ""
    (line,) = captured.err.splitlines()
    assert line.startswith("rdmactl: daemon unreachable:") and "hint:" in line


@pytest.mark.parametrize("interval", ["0", "-1", "soon", "nan"])
def test_stats_interval_must_be_a_positive_number(
    interval: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exc:
        parse_args(["stats", "--watch", "--interval", interval])
    assert exc.value.code == 2
    assert "positive number of seconds" in capsys.readouterr().err


@pytest.mark.parametrize("address", ["foo", "unix:path", "/run/dbus/system_bus_socket"])
def test_a_bus_address_that_is_not_one_is_a_usage_error(
    address: str, capsys: pytest.CaptureFixture[str]
) -> None:
    # no retry would ever reach it: a usage error (2), not "unreachable" (3)
    line = usage_error(["--bus-address", address, "status"], capsys)
    assert "--bus-address" in line and repr(address) in line and "not a D-Bus address" in line


def test_a_malformed_system_bus_variable_is_a_usage_error_naming_it(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DBUS_SYSTEM_BUS_ADDRESS", "foo")
    assert "$DBUS_SYSTEM_BUS_ADDRESS: 'foo'" in usage_error(["status"], capsys)


def test_the_unreachable_line_names_the_bus_it_tried(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--bus-address", "unix:path=/nonexistent/bus", "status"]) == 3
    line = capsys.readouterr().err
    assert "bus unix:path=/nonexistent/bus: cannot connect: No such file or directory" in line


def test_without_an_address_the_system_bus_is_the_one_tried(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("DBUS_SYSTEM_BUS_ADDRESS", raising=False)
    monkeypatch.setattr("rdmad.bus.address.SYSTEM_BUS", "unix:path=/nonexistent/system_bus_socket")
    assert main(["status"]) == 3
    assert "bus unix:path=/nonexistent/system_bus_socket:" in capsys.readouterr().err


def test_stats_interval_without_watch_is_a_usage_error(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # it would be ignored: one reading, not one every 5 seconds
    assert "--interval only goes with --watch" in usage_error(["stats", "--interval", "5"], capsys)


@pytest.mark.parametrize("timeout", ["0", "-3", "never"])
def test_a_timeout_that_is_not_a_positive_number_is_a_usage_error(
    timeout: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert "--timeout" in usage_error(["--timeout", timeout, "list"], capsys)
