from __future__ import annotations

import re

import pytest
from dbus_fast.validators import is_object_path_valid
from hypothesis import given
from hypothesis import strategies as st

from rdmad.bus.names import _HEX, _plain, claim_path, device_path, escape_label


def unescape_label(label: str) -> str:
    """escape_label's inverse: it exists to show that escaping never maps two names to one
    path. Raises ValueError on text escape_label cannot produce."""
    if label == "_":
        return ""
    raw = bytearray()
    i = 0
    while i < len(label):
        ch = label[i]
        if ch == "_":
            pair = label[i + 1 : i + 3]
            if len(pair) != 2 or any(c not in _HEX for c in pair):
                raise ValueError(f"bad escape in object-path label {label!r}")
            raw.append(int(pair, 16))
            i += 3
        elif _plain(ch):
            raw.append(ord(ch))
            i += 1
        else:
            raise ValueError(f"character {ch!r} cannot appear in an object-path label")
    return raw.decode("utf-8", "surrogateescape")


@pytest.mark.parametrize(
    ("name", "label"),
    [("mlx5_0", "mlx5_5f0"), ("rxe0", "rxe0"), ("", "_"), ("a-b.c", "a_2db_2ec")],
)
def test_escape_follows_systemd_bus_label_escape(name: str, label: str) -> None:
    assert escape_label(name) == label


@given(st.text())
def test_escape_then_unescape_gives_back_any_text(text: str) -> None:
    assert unescape_label(escape_label(text)) == text


@given(st.text())
def test_escaped_label_uses_only_object_path_characters(text: str) -> None:
    assert re.fullmatch(r"[A-Za-z0-9_]+", escape_label(text))


@given(st.text())
def test_device_and_claim_paths_are_valid_object_paths(text: str) -> None:
    assert is_object_path_valid(device_path(text))
    assert is_object_path_valid(claim_path(text))
