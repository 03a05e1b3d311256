"""Daemon settings: defaults, then the TOML file, then the command line."""

from __future__ import annotations

from pathlib import Path

import pytest

from rdmad.daemon.config import ConfigError, load, parser


def test_defaults() -> None:
    cfg = load([])
    assert (cfg.cdi_dir, cfg.shared_limit, cfg.netns_mode, cfg.sim_devices) == (
        Path("/var/run/cdi"),
        16,
        "",
        "",
    )


def test_file_settings_apply_and_options_override_them(tmp_path: Path) -> None:
    conf = tmp_path / "rdmad.toml"
    conf.write_text('state-dir = "/tmp/s"\nshared_limit = 4\nnetns_mode = "exclusive"\n')
    cfg = load(["--config", str(conf), "--shared-limit", "8"])
    assert (cfg.state_dir, cfg.shared_limit, cfg.netns_mode) == (Path("/tmp/s"), 8, "exclusive")


def test_bus_address_falls_back_to_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DBUS_SYSTEM_BUS_ADDRESS", "unix:path=/tmp/x")
    assert load([]).bus_address == "unix:path=/tmp/x"
    assert load(["--bus-address", "unix:path=/tmp/y"]).bus_address == "unix:path=/tmp/y"


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("colour = 1\n", "unknown setting"),
        ("shared_limit = 'many'\n", "must be an integer"),
        ("shared_limit = true\n", "must be an integer"),
        ("netns_mode = 'promiscuous'\n", "netns_mode"),
        ("shared_limit = 0\n", "at least 1"),
        ("this is not toml", "cannot read"),
        ("allowed_group = 'rdma'\n", "allowed_group is gone: polkit decides"),
    ],
)
def test_bad_files_are_refused_with_the_reason(tmp_path: Path, text: str, says: str) -> None:
    conf = tmp_path / "rdmad.toml"
    conf.write_text(text)
    with pytest.raises(ConfigError, match=says):
        load(["--config", str(conf)])


def test_the_simulated_backend_is_accepted_but_not_offered_in_help() -> None:
    assert "--sim" not in parser().format_help()
    cfg = load(["--sim-devices", "sim0=veth0", "--sim-mode", "exclusive"])
    assert (cfg.sim_devices, cfg.sim_mode) == ("sim0=veth0", "exclusive")


def test_a_netns_mode_on_the_command_line_is_checked_like_one_in_the_file() -> None:
    with pytest.raises(ConfigError, match="netns_mode: netns mode must be"):
        load(["--netns-mode", "promiscuous"])
