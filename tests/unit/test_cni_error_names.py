"""rdmad-cni's copy of rdmad's D-Bus error names (cni/rdmad.go's errorCodes, each a CNI
error code) names every error of rdmad/errors.py, and nothing else."""

from __future__ import annotations

import re
from pathlib import Path

from rdmad import errors

GO_SOURCE = Path(__file__).parents[2] / "cni" / "rdmad.go"


def go_error_codes() -> dict[str, int]:
    source = GO_SOURCE.read_text()
    block = re.search(r"var errorCodes = map\[string\]uint\{(.*?)\n\}", source, re.S)
    assert block is not None, f"no errorCodes map in {GO_SOURCE}"
    return {name: int(code) for name, code in re.findall(r'"([\w.]+)":\s*(\d+)', block[1])}


def dbus_names() -> set[str]:
    found: set[str] = set()
    todo: list[type[errors.RdmadError]] = [errors.RdmadError]
    while todo:
        cls = todo.pop()
        found.add(cls.dbus_name)
        todo.extend(cls.__subclasses__())
    return found


def test_the_plugin_knows_every_error_rdmad_replies_with_and_no_other() -> None:
    assert set(go_error_codes()) == dbus_names()


def test_each_error_has_a_cni_code_of_its_own_from_100() -> None:
    codes = list(go_error_codes().values())
    assert len(set(codes)) == len(codes)
    assert min(codes) >= 100
