from __future__ import annotations

import re

import pytest
from dbus_fast.validators import is_object_path_valid
from hypothesis import given
from hypothesis import strategies as st

from rdmad.bus.names import claim_path, device_path, escape_label, label_of, unescape_label


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
    assert label_of(device_path(text)) == text


@pytest.mark.parametrize("label", ["_zz", "_4", "a-b", "a_2"])
def test_unescape_rejects_what_escape_never_produces(label: str) -> None:
    with pytest.raises(ValueError):
        unescape_label(label)
