"""The docs name only what exists: every repo path in docs/*.md, README.md and
bench/README.md is a file or folder of the repository, every Markdown link to a local file
resolves, and every Python name they give in backticks (`Class.method`, `module.function`,
`rdmad.x.y`, a private `_helper`) is defined in the repository's Python (read by AST, not
imported). D-Bus names (`Manager.Claim`, `io.rdmad1.Manager`, `io.rdmad1.Error.*`) are
checked against the introspection XML in dbus/ and the error names in rdmad/errors.py.
Backticked tokens that are none of these (CLI commands, JSON keys, kernel names) are not
checked."""

from __future__ import annotations

import ast
import re
import sys
import xml.etree.ElementTree as ET
from collections import defaultdict
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DOCS = sorted([*REPO.glob("docs/*.md"), REPO / "README.md", REPO / "bench/README.md"])
PYTHON_TREES = ("rdmad", "testbed", "tests", "bench")

# The repo's top folders that a doc names paths under.
TOP = ("rdmad", "testbed", "tests", "scripts", "bench", "cni", "dbus", "debian", "systemd", "docs",
       "requirements", ".ci", "deploy")  # fmt: skip
# Paths made by a build or a run, not kept in git.
GENERATED = ("bench/out",)
# Names the docs give from other projects: a library's API, not rdmad's.
OUTSIDE = {
    "rdma.max",  # the kernel's cgroup v2 files
    "rdma.current",
    "cgroup.controllers",
    "cgroup.subtree_control",
    "Monitor.poll",  # pyudev
    "asyncio.Event",
    "asyncio.run",
    "gc.freeze",
    "os._exit",
    "skel.PluginMainFuncs",  # the CNI project's Go library
    "types.NetConf",
    "ipam.ExecAdd",
    "ipam.ExecDel",
    "MessageBus.send",  # dbus-fast's internals, named where rdmad works around them
    "_disconnected",
    "_pending_futures",
    "_interface_signal_notify",
}
# The bus's standard interfaces that rdmad's objects implement.
STANDARD_BUS = {
    "ObjectManager": {"GetManagedObjects", "InterfacesAdded", "InterfacesRemoved"},
    "Properties": {"Get", "GetAll", "Set", "PropertiesChanged"},
    "Introspectable": {"Introspect"},
}
# A token ending in one of these is a file name; a bare *.py, *.go or *.sh must be one of the
# repository's files, the others (runtime files, domain names) are not checked.
FILE_SUFFIXES = {"py", "go", "sh", "json", "txt", "toml", "conf", "service", "xml", "md",
                 "sock", "log", "deb", "proto", "io", "dev", "com", "org", "socket"}  # fmt: skip
CHECKED_FILES = {"py", "go", "sh"}

PATH_RE = re.compile(
    r"(?<![\w./<>$~@:-])((?:" + "|".join(map(re.escape, TOP)) + r")/[\w./*<>{},-]*)"
)
LINK_RE = re.compile(r"\]\(([^)\s]+)\)")
CODE_RE = re.compile(r"`([^`\n]+)`")
FENCE_RE = re.compile(r"^```.*?^```", re.S | re.M)
DOTTED_RE = re.compile(r"[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)+")
PRIVATE_RE = re.compile(r"_[a-z]\w*")


@dataclass
class PyIndex:
    """What the repository's Python defines, by AST."""

    modules: dict[str, Path] = field(default_factory=dict)  # dotted name -> file
    top: dict[str, set[str]] = field(default_factory=lambda: defaultdict(set))  # module -> names
    classes: dict[str, set[str]] = field(default_factory=lambda: defaultdict(set))  # members
    bases: dict[str, set[str]] = field(default_factory=lambda: defaultdict(set))
    by_basename: dict[str, set[str]] = field(default_factory=lambda: defaultdict(set))
    every_name: set[str] = field(default_factory=set)

    def members(self, cls: str) -> set[str]:
        seen: set[str] = set()
        out: set[str] = set()
        todo = [cls]
        while todo:
            c = todo.pop()
            if c not in seen:
                seen.add(c)
                out |= self.classes.get(c, set())
                todo.extend(self.bases.get(c, ()))
        return out


def _targets(node: ast.AST) -> list[str]:
    if isinstance(node, ast.Name):
        return [node.id]
    if isinstance(node, ast.Tuple):
        return [n for elt in node.elts for n in _targets(elt)]
    return []


def _class_members(node: ast.ClassDef) -> set[str]:
    names: set[str] = set()
    for item in node.body:
        if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(item.name)
        elif isinstance(item, ast.Assign):
            names.update(n for t in item.targets for n in _targets(t))
        elif isinstance(item, ast.AnnAssign):
            names.update(_targets(item.target))
    for sub in ast.walk(node):  # self.x = ... in any method
        if (
            isinstance(sub, ast.Attribute)
            and isinstance(sub.ctx, ast.Store)
            and isinstance(sub.value, ast.Name)
            and sub.value.id == "self"
        ):
            names.add(sub.attr)
    return names


@cache
def python_index() -> PyIndex:
    index = PyIndex()
    for tree in PYTHON_TREES:
        for path in sorted((REPO / tree).rglob("*.py")):
            parts = path.relative_to(REPO).with_suffix("").parts
            module = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            index.modules[module] = path
            index.by_basename[module.rsplit(".", 1)[-1]].add(module)
            body = ast.parse(path.read_text(), str(path))
            for stmt in body.body:
                if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                    index.top[module].add(stmt.name)
                elif isinstance(stmt, ast.Assign):
                    index.top[module].update(n for t in stmt.targets for n in _targets(t))
                elif isinstance(stmt, ast.AnnAssign):
                    index.top[module].update(_targets(stmt.target))
            for node in ast.walk(body):
                if isinstance(node, ast.ClassDef):
                    index.classes[node.name] |= _class_members(node)
                    index.bases[node.name].update(
                        b.id if isinstance(b, ast.Name) else b.attr
                        for b in node.bases
                        if isinstance(b, (ast.Name, ast.Attribute))
                    )
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                    index.every_name.add(node.name)
                elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
                    index.every_name.add(node.attr)
                elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                    index.every_name.add(node.id)
    return index


@dataclass
class BusIndex:
    """The D-Bus API: interfaces by full and short name, their members, the error names."""

    members: dict[str, set[str]]  # io.rdmad1.Manager and Manager -> methods, signals, props
    errors: set[str]
    actions: set[str]  # polkit/io.rdmad1.policy: io.rdmad1.claim-share, ...


@cache
def bus_index() -> BusIndex:
    members: dict[str, set[str]] = dict(STANDARD_BUS)
    for xml in sorted((REPO / "dbus").glob("*.xml")):
        for iface in ET.parse(xml).getroot().iter("interface"):
            names = {m.get("name", "") for m in iface if m.tag in {"method", "signal", "property"}}
            members[iface.get("name", "")] = names
            members[iface.get("name", "").rsplit(".", 1)[-1]] = names
    errors = set()  # rdmad/errors.py: dbus_name = _PREFIX + "NoSuchDevice"
    for node in ast.walk(ast.parse((REPO / "rdmad/errors.py").read_text())):
        if isinstance(node, ast.BinOp) and isinstance(node.right, ast.Constant):
            assert isinstance(node.right.value, str)
            errors.add(f"io.rdmad1.Error.{node.right.value}")
    policy = ET.parse(REPO / "polkit/io.rdmad1.policy").getroot()
    actions = {a.get("id", "") for a in policy.iter("action")}
    return BusIndex(members, errors, actions)


def _resolve_module(dotted: str) -> tuple[str, list[str]] | None:
    """The longest module `dotted` starts with, and the names after it."""
    parts = dotted.split(".")
    for i in range(len(parts), 0, -1):
        if ".".join(parts[:i]) in python_index().modules:
            return ".".join(parts[:i]), parts[i:]
    return None


def _in_module(module: str, rest: list[str]) -> bool:
    index = python_index()
    if not rest:
        return True
    if rest[0] not in index.top[module]:
        return False
    return len(rest) == 1 or (len(rest) == 2 and rest[1] in index.members(rest[0]))


def python_name_problem(dotted: str) -> str | None:
    """Why `dotted` names nothing in the repository, or None if it does (or is not ours)."""
    index = python_index()
    first, rest = dotted.split(".", 1)[0], dotted.split(".")[1:]
    if dotted in OUTSIDE or (first in sys.stdlib_module_names and first not in index.by_basename):
        return None
    if first in {"rdmad", "testbed", "tests", "bench"}:
        found = _resolve_module(dotted)
        if found is None or not _in_module(*found):
            return "no such module, or no such name in it"
        return None
    if first in index.classes:
        if len(rest) == 1 and rest[0] in index.members(first):
            return None
        if first in bus_index().members and rest[0] in bus_index().members[first]:
            return None  # a class that has a D-Bus interface's name: Claim.GetCounters
        return f"{first} has no member {rest[0]}"
    if first in bus_index().members:
        if len(rest) == 1 and rest[0] in bus_index().members[first]:
            return None
        return f"the D-Bus interface {first} has no member {rest[0]}"
    if first in index.by_basename and len(rest) <= 2:  # net.ipv4.conf.all.*: a sysctl
        if any(_in_module(m, rest) for m in index.by_basename[first]):
            return None
        return f"no module named {first} defines {'.'.join(rest)}"
    if first[0].isupper() and not first.isupper():  # CONTAINERID.IFNAME: a placeholder
        return f"no class {first} in the repository's Python"
    return None  # a JSON key, a sysctl, a file name: not a Python name


def bus_name_problem(dotted: str) -> str | None:
    bus = bus_index()
    if dotted.startswith("io.rdmad1.Error."):
        return None if dotted in bus.errors else "no such error name in rdmad/errors.py"
    if dotted in bus.members or dotted in {"io.rdmad1", "io.rdmad1.conf", "io.rdmad1.service"}:
        return None
    if dotted in bus.actions:
        return None
    if "-" in dotted:
        return "no such action in polkit/io.rdmad1.policy"
    iface, _, member = dotted.rpartition(".")
    if iface in bus.members and member in bus.members[iface]:
        return None
    return "no such D-Bus interface or member in dbus/*.xml"


def code_spans(text: str) -> list[str]:
    return CODE_RE.findall(FENCE_RE.sub("", text))


@cache
def repo_basenames() -> set[str]:
    return {p.name for top in TOP if (REPO / top).is_dir() for p in (REPO / top).rglob("*")}


def file_name_problem(token: str) -> str | None:
    if token.rsplit(".", 1)[-1] not in CHECKED_FILES or "/" in token:
        return None
    return None if token in repo_basenames() else "no file of that name in the repository"


def name_problems(doc: Path) -> list[str]:
    problems = []
    text = doc.read_text()
    for span in code_spans(text):
        token = re.sub(r"\(.*\)$", "", span.strip())
        if token.rsplit(".", 1)[-1] in FILE_SUFFIXES:
            why = file_name_problem(token)
        elif token.startswith("io.rdmad1"):
            why = bus_name_problem(re.match(r"[\w.-]+", token)[0])  # type: ignore[index]
        elif DOTTED_RE.fullmatch(token):
            why = python_name_problem(token)
        elif PRIVATE_RE.fullmatch(token):
            why = None if token in python_index().every_name | OUTSIDE else "defined nowhere"
        else:
            continue
        if why:
            problems.append(f"`{span}`: {why}")
    return problems


def _exists(path: str) -> bool:
    """Whether `path` exists; a path with a placeholder (<id>, NAME, {a,b}, ...) is taken as
    is, and a bare `top/word` in prose is a phrase (rdmad/raw: a ratio), not a path."""
    if "<" in path or "{" in path or path.endswith("...") or path.startswith(GENERATED):
        return True
    path = path.rstrip(".,:;")
    parts = path.rstrip("/").split("/")
    if any(p.isupper() for p in parts) or (len(parts) == 2 and "." not in parts[1]
                                           and not path.endswith("/")):  # fmt: skip
        return True
    if "*" in path:
        return any(REPO.glob(path))
    return (REPO / path.split("#")[0]).exists()


def path_problems(doc: Path) -> list[str]:
    text = doc.read_text()
    problems = [f"{p}: no such path in the repository" for p in PATH_RE.findall(text)
                if not _exists(p)]  # fmt: skip
    for target in LINK_RE.findall(text):
        if re.match(r"[a-z]+:|#", target):
            continue  # a URL, or an anchor of this page
        if not (doc.parent / target.split("#")[0]).exists():
            problems.append(f"link ({target}): no such file")
    return problems


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(REPO)))
def test_every_python_and_bus_name_a_doc_gives_exists(doc: Path) -> None:
    assert name_problems(doc) == []


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(REPO)))
def test_every_repo_path_and_link_a_doc_gives_exists(doc: Path) -> None:
    assert path_problems(doc) == []


@pytest.mark.parametrize(
    "stale",
    ["Core._rdma_home", "SimRdma._return_orphans", "rdmad.core.nothing", "_no_such_helper",
     "Manager.NoSuchMethod", "io.rdmad1.Error.NoSuchError", "NoSuchClass.method"],
)  # fmt: skip
def test_a_stale_name_is_found(stale: str, tmp_path: Path) -> None:
    doc = tmp_path / "page.md"
    doc.write_text(f"Done by `{stale}`.\n")
    assert name_problems(doc) != []


@pytest.mark.parametrize(
    "real",
    ["Manager.Claim", "Claim.GetCounters", "io.rdmad1.Manager", "io.rdmad1.Claim.Release",
     "rdmad.core.steps", "GiveBack._rdma_home", "pod_cdi_name", "net.ipv4.conf.all.arp_ignore",
     "rdmactl claims --json", "Device.GetCounters"],
)  # fmt: skip
def test_a_real_or_foreign_name_passes(real: str, tmp_path: Path) -> None:
    doc = tmp_path / "page.md"
    doc.write_text(f"Done by `{real}`.\n")
    assert name_problems(doc) == []


def test_a_missing_path_is_found(tmp_path: Path) -> None:
    doc = tmp_path / "page.md"
    doc.write_text("See rdmad/core/nothing.py and [x](gone.md).\n")
    assert len(path_problems(doc)) == 2
