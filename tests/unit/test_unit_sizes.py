"""Small units: no class in rdmad/ over about 400 lines, no function over about 60 (an AST
walk; generated protobuf modules aside)."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

import rdmad

ROOT = Path(rdmad.__file__).parent
# "about": a class may run a few lines over while a cut would split one thought
LIMITS = {ast.ClassDef: 410, ast.FunctionDef: 60, ast.AsyncFunctionDef: 60}


def units() -> Iterator[tuple[str, type[ast.AST], int]]:
    for path in sorted(ROOT.rglob("*.py")):
        if path.name.endswith(("_pb2.py", "_pb2_grpc.py")):
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if type(node) in LIMITS:
                assert isinstance(node, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
                where = f"{path.relative_to(ROOT.parent)}:{node.lineno} {node.name}"
                yield where, type(node), (node.end_lineno or node.lineno) - node.lineno + 1


@pytest.mark.parametrize("kind", [ast.ClassDef, ast.FunctionDef], ids=["class", "function"])
def test_no_unit_is_over_its_bound(kind: type[ast.AST]) -> None:
    kinds = {kind, ast.AsyncFunctionDef} if kind is ast.FunctionDef else {kind}
    over = [f"{where}: {n} lines" for where, k, n in units() if k in kinds and n > LIMITS[k]]
    assert not over, f"over {LIMITS[kind]} lines:\n" + "\n".join(over)
