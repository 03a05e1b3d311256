"""The default config file shipped in /etc/rdmad (systemd/rdmad.toml) documents every setting."""

from __future__ import annotations

import re
import tomllib
from dataclasses import fields
from pathlib import Path

from rdmad.daemon.config import Config, load

SHIPPED = Path(__file__).resolve().parents[2] / "systemd" / "rdmad.toml"


def _uncommented() -> dict[str, object]:
    """The commented-out settings (`#name = value`; prose lines start with `# `)."""
    settings = re.findall(r"^#([a-z_]+ = .*)$", SHIPPED.read_text(), flags=re.M)
    return tomllib.loads("\n".join(settings))


def test_as_shipped_it_changes_nothing() -> None:
    assert load(["--config", str(SHIPPED)]) == load([])


def test_it_shows_every_setting() -> None:
    assert set(_uncommented()) == {f.name for f in fields(Config)}


def test_each_shown_value_is_the_default() -> None:
    defaults = Config()
    for name, value in _uncommented().items():
        default = getattr(defaults, name)
        assert value == (str(default) if isinstance(default, Path) else default), name
