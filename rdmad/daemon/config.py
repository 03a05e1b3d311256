"""Daemon settings: defaults, then the TOML file (--config), then command-line options."""

from __future__ import annotations

import argparse
import os
import tomllib
from dataclasses import dataclass, fields
from pathlib import Path

from rdmad import __version__
from rdmad.errors import InvalidArgs
from rdmad.options import parse_netns_mode, parse_table_range


@dataclass
class Config:
    bus_address: str = ""  # "" = the system bus (or DBUS_SYSTEM_BUS_ADDRESS)
    state_dir: Path = Path(os.environ.get("RUNTIME_DIRECTORY", "/run/rdmad").split(":")[0])
    cdi_dir: Path = Path("/var/run/cdi")
    log_level: str = "info"
    netns_mode: str = ""  # apply this RDMA netns mode at start ("" = leave the kernel's)
    shared_limit: int = 16  # shared claims per device
    sim_devices: str = ""  # NAME=NETDEV,...: the explicit simulated RDMA backend
    sim_mode: str = "shared"
    # Policy routing: the tables a claim's table=auto is given from. Spiderpool and DRANET
    # number theirs from 100, so rdmad's range stays clear of 100-199.
    route_tables: str = "1000-1999"
    # Where the cgroup2 hierarchy is mounted: claims' cgroups are named below it.
    cgroup_root: Path = Path("/sys/fs/cgroup")


class ConfigError(Exception):
    """A bad setting. Raised at start only (load(), and the daemon's wiring before the bus
    name is taken): it stops rdmad with its message and never reaches a D-Bus caller, so
    it is not an RdmadError."""


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="rdmad",
        description="Hand RDMA devices to network namespaces, over D-Bus (io.rdmad1).",
    )
    p.add_argument("--version", action="version", version=f"rdmad {__version__}")
    p.add_argument("--config", type=Path, help="TOML file with the settings below")
    p.add_argument("--bus-address", help="D-Bus address (default: the system bus)")
    p.add_argument("--state-dir", type=Path, help="runtime state (default /run/rdmad)")
    p.add_argument("--cdi-dir", type=Path, help="CDI spec directory (default /var/run/cdi)")
    p.add_argument("--log-level", choices=["debug", "info", "warning", "error"])
    p.add_argument("--netns-mode", metavar="{shared,exclusive}", help="apply at start")
    p.add_argument("--shared-limit", type=int, help="shared claims per device (default 16)")
    p.add_argument(
        "--route-tables", metavar="FIRST-LAST", help="tables for table=auto (default 1000-1999)"
    )
    p.add_argument("--cgroup-root", type=Path, help="the cgroup2 mount (default /sys/fs/cgroup)")
    # The simulated RDMA backend (rdmad.kernel.sim) is for tests, benchmarks and the host demo:
    # accepted, but kept out of --help so that nobody mistakes it for a production feature.
    p.add_argument("--sim-devices", metavar="NAME=NETDEV[,...]", help=argparse.SUPPRESS)
    p.add_argument("--sim-mode", metavar="{shared,exclusive}", help=argparse.SUPPRESS)
    return p


def load(argv: list[str] | None = None) -> Config:
    args = parser().parse_args(argv)
    cfg = Config()
    if args.config is not None:
        _apply_file(cfg, args.config)
    for f in fields(Config):
        value = getattr(args, f.name, None)
        if value is not None:
            setattr(cfg, f.name, value)
    if not cfg.bus_address:
        cfg.bus_address = os.environ.get("DBUS_SYSTEM_BUS_ADDRESS", "")
    _check(cfg)
    return cfg


# Settings that no longer exist, and what took their place.
_GONE = {
    "allowed_group": "polkit decides who besides root may change state; the rule that "
    "lets a group do it is in docs/dbus-api.md (Who may call what)",
}


def _apply_file(cfg: Config, path: Path) -> None:
    try:
        doc = tomllib.loads(path.read_text())
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(f"cannot read {path}: {exc}") from exc
    known = {f.name: f for f in fields(Config)}
    for key, value in doc.items():
        name = key.replace("-", "_")
        if name in _GONE:
            raise ConfigError(f"{path}: {key} is gone: {_GONE[name]}")
        if name not in known:
            raise ConfigError(f"{path}: unknown setting {key!r}")
        default = getattr(Config(), name)
        if isinstance(default, Path):
            value = Path(value)
        elif not isinstance(value, type(default)) or isinstance(value, bool) != isinstance(
            default, bool
        ):
            kind = {int: "an integer", str: "a string"}.get(type(default), type(default).__name__)
            raise ConfigError(f"{path}: {key} must be {kind}")
        setattr(cfg, name, value)


def _check(cfg: Config) -> None:
    for name in ("netns_mode", "sim_mode"):
        value = getattr(cfg, name)
        if value:
            try:
                parse_netns_mode(value)
            except InvalidArgs as exc:
                raise ConfigError(f"{name}: {exc}") from None
    try:
        parse_table_range(cfg.route_tables)
    except InvalidArgs as exc:
        raise ConfigError(f"route_tables: {exc}") from None
    if cfg.shared_limit < 1:
        raise ConfigError("shared_limit must be at least 1")
