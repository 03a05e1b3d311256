"""rdmad's layers, as its folders show them, and the imports each may make: an AST walk over
every module of rdmad/. The vocabulary (rdmad/*.py) and the core import nothing from outside
the standard library; the kernel adapters implement the core's ports; the bus serves the
core; the daemon wires them; the clients (rdmactl, the exporter, rdmad-dra) speak only the
bus, through its client modules, which import no core."""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

import rdmad

ROOT = Path(rdmad.__file__).parent
VOCABULARY = {"rdmad", "rdmad.model", "rdmad.errors", "rdmad.options"}
CORE_PORTS = {"rdmad.core.backend", "rdmad.core.events", "rdmad.core.steps"}
BUS_CLIENT = {
    "rdmad.bus",
    "rdmad.bus.address",
    "rdmad.bus.argtypes",
    "rdmad.bus.client",
    "rdmad.bus.connection",
    "rdmad.bus.names",
}
CLIENTS = ("cli", "exporter", "dra")

# layer: (the rdmad modules or packages it may import, the outside packages it may import)
RULES: dict[str, tuple[set[str], set[str]]] = {
    "vocabulary": (VOCABULARY, set()),
    "core": (VOCABULARY | {"rdmad.core.*"}, set()),
    "kernel": (VOCABULARY | CORE_PORTS | {"rdmad.kernel.*"}, {"pyudev"}),
    "bus": (
        VOCABULARY
        | {"rdmad.bus.*", "rdmad.core.backend", "rdmad.core.observer", "rdmad.core.opstats"},
        {"dbus_fast"},
    ),
    "daemon": (
        VOCABULARY | {"rdmad.core.*", "rdmad.kernel.*", "rdmad.bus.*", "rdmad.daemon.*"},
        {"dbus_fast", "pyudev", "systemd"},
    ),
    "cli": (VOCABULARY | BUS_CLIENT | {"rdmad.cli.*"}, {"dbus_fast"}),
    "exporter": (
        VOCABULARY | BUS_CLIENT | {"rdmad.exporter.*"},
        {"dbus_fast", "prometheus_client"},
    ),
    "dra": (
        VOCABULARY | BUS_CLIENT | {"rdmad.dra.*"},
        {"dbus_fast", "grpclib", "google", "kubernetes", "urllib3"},
    ),
}


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def layer_of(module: str) -> str:
    parts = module.split(".")
    if module in VOCABULARY:
        return "vocabulary"
    assert len(parts) > 2 or (module.count(".") == 1 and (ROOT / parts[1]).is_dir()), (
        f"{module}: a module at the top of rdmad/ that is not vocabulary; put it in a layer"
    )
    return parts[1]


def imports(path: Path) -> Iterator[tuple[int, str]]:
    """Every module `path` imports, by its full name (`from a import b`: a.b where b is a
    module, else a)."""
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            yield from ((node.lineno, alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:
                full = f"{node.module}.{alias.name}"
                is_module = (ROOT.parent / full.replace(".", "/")).with_suffix(".py").exists() or (
                    ROOT.parent / full.replace(".", "/")
                ).is_dir()
                yield node.lineno, full if is_module else node.module


def allowed(layer: str, imported: str) -> bool:
    top = imported.split(".")[0]
    if top in sys.stdlib_module_names or top == "__future__":
        return True
    ours, outside = RULES[layer]
    if top != "rdmad":
        return top in outside
    return imported in ours or any(
        rule.endswith(".*") and (imported + ".").startswith(rule[:-1]) for rule in ours
    )


MODULES = sorted(ROOT.rglob("*.py"))


def test_every_folder_of_rdmad_is_a_layer_with_rules() -> None:
    folders = {p.name for p in ROOT.iterdir() if p.is_dir() and p.name != "__pycache__"}
    assert folders == set(RULES) - {"vocabulary"}


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(ROOT.parent)))
def test_a_module_imports_only_what_its_layer_may(path: Path) -> None:
    layer = layer_of(module_name(path))
    wrong = [f"line {n}: {m}" for n, m in imports(path) if not allowed(layer, m)]
    assert not wrong, f"{path} ({layer} layer) imports what its layer may not: {wrong}"


@pytest.mark.parametrize(
    ("layer", "imported", "ok"),
    [
        ("core", "rdmad.kernel.rtnl", False),
        ("core", "dbus_fast", False),
        ("core", "rdmad.core.claims", True),
        ("kernel", "rdmad.core.core", False),
        ("kernel", "rdmad.core.backend", True),
        ("cli", "rdmad.bus.service", False),
        ("cli", "rdmad.core.model", False),
        ("dra", "rdmad.daemon.cdi", False),
        ("exporter", "rdmad.bus.client", True),
        ("vocabulary", "rdmad.core.store", False),
    ],
)
def test_the_rules_refuse_what_crosses_a_layer(layer: str, imported: str, ok: bool) -> None:
    assert allowed(layer, imported) == ok
