"""The layers of ARCHITECTURE.md, checked on the source: every import (at module level or inside a
function) runs one way, core <- workloads <- systems <- harness <- report/lab/sim/regress <- cli,
with no import cycle anywhere, and `psbench --help` / `psbench list` stay light."""
from __future__ import annotations

import ast
import os
import subprocess
import sys
import tomllib
from pathlib import Path

import psutil
import pytest

ROOT = Path(__file__).resolve().parent.parent
# The source is psbench/; the design card's top-level folders are links into it.
LINKED = ("bench", "systems", "workloads")
# A module may import only modules of its own rank or below.
RANKS = [
    ("psbench.core", 0),
    ("psbench.workloads", 1),
    ("psbench.systems", 2),
    ("psbench.bench.harness", 3),
    ("psbench.bench.report", 4), ("psbench.bench.lab", 4), ("psbench.bench.sim", 4), ("psbench.bench.regress", 4),
    ("psbench.bench.cli", 5), ("psbench.bench", 5), ("psbench.__main__", 6), ("psbench", 6),
]


def rank(module: str) -> int:
    for prefix, r in RANKS:
        if module == prefix or module.startswith(prefix + "."):
            return r
    raise AssertionError(f"{module} is in no layer; add it to RANKS and ARCHITECTURE.md")


def source_modules() -> dict[str, Path]:
    modules = {}
    for path in sorted((ROOT / "psbench").rglob("*.py")):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        modules[".".join(parts)] = path
    return modules


def imports_of(module: str, path: Path, known: set[str]) -> set[str]:
    """Project modules `module` imports anywhere in its file (functions included)."""
    found: set[str] = set()
    package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1] + ([base] if base else []))
            names = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]
        else:
            continue
        for name in names:
            top = name.split(".")[0]
            assert top not in ("bench", "systems", "workloads"), \
                f"{module} imports '{name}': the project's modules are imported as psbench.{name}"
            while name and name not in known:
                name = name.rpartition(".")[0]
            if name and name != module:
                found.add(name)
    return found


def import_graph() -> dict[str, set[str]]:
    modules = source_modules()
    return {m: imports_of(m, p, set(modules)) for m, p in modules.items()}


def test_every_import_points_down_the_layers():
    wrong = [f"{m} (layer {rank(m)}) imports {d} (layer {rank(d)})"
             for m, deps in import_graph().items() for d in sorted(deps) if rank(d) > rank(m)]
    assert not wrong, "imports against the layers:\n" + "\n".join(wrong)


# Where one system's package imports another's: only where it is built on it. Strategy-Switch runs
# PS and DDP phases; the PS worker can stop at a switch criterion; rpc-ps listens for torch's store
# as DDP does. Shared helpers (the exposure check, the token) live in the core or in systems/*.py.
BUILT_ON = {("switch", "ps"), ("switch", "ddp"), ("ps", "switch"), ("rpc_ps", "ddp")}


def test_a_system_imports_another_only_where_it_is_built_on_it():
    systems = {path.parent.name for m, path in source_modules().items()
               if m.startswith("psbench.systems.") and path.name == "__init__.py"}

    def system_of(module: str) -> str | None:
        parts = module.split(".")
        return parts[2] if len(parts) > 2 and parts[2] in systems else None

    crossing = {(system_of(m), system_of(d)) for m, deps in import_graph().items() for d in deps
                if system_of(m) and system_of(d) and system_of(m) != system_of(d)}
    assert crossing <= BUILT_ON, f"a system imports another's package: {sorted(crossing - BUILT_ON)}"


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan), each a cycle."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_no_import_cycle():
    cycles = _cycles(import_graph())
    assert not cycles, "import cycles:\n" + "\n".join(" <-> ".join(c) for c in cycles)


def test_the_cycle_check_finds_a_cycle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def private_uses(module: str, path: Path, known: set[str]) -> list[str]:
    """Another project module's private (`_name`) helpers that `module` imports or reaches for."""
    tree = ast.parse(path.read_text(), str(path))
    aliases: dict[str, str] = {}  # local name -> the project module it is bound to
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("psbench"):
            for a in node.names:
                if f"{node.module}.{a.name}" in known:
                    aliases[a.asname or a.name] = f"{node.module}.{a.name}"
                elif a.name.startswith("_") and node.module != module:
                    found.append(f"{module} imports {node.module}.{a.name}")
        elif isinstance(node, ast.Import):
            aliases.update({a.asname: a.name for a in node.names if a.asname and a.name in known})
    for node in ast.walk(tree):
        if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in aliases
                and node.attr.startswith("_") and not node.attr.startswith("__")):
            found.append(f"{module} uses {aliases[node.value.id]}.{node.attr}")
    return found


def test_no_module_uses_a_private_helper_of_another():
    """A helper two modules share is public in the module that owns it."""
    modules = source_modules()
    wrong = [use for m, p in modules.items() for use in private_uses(m, p, set(modules))]
    assert not wrong, "private helpers used across modules:\n" + "\n".join(wrong)


def test_the_private_check_sees_an_import_and_an_attribute(tmp_path):
    known = {"psbench.bench.report.plots", "psbench.bench.report.document"}
    src = tmp_path / "m.py"
    src.write_text("from psbench.bench.report.plots import _facets, save\n"
                   "from psbench.bench.report import plots as p\n"
                   "p._strategy_order([]); p.save\n")
    assert private_uses("psbench.bench.report.document", src, known) == [
        "psbench.bench.report.document imports psbench.bench.report.plots._facets",
        "psbench.bench.report.document uses psbench.bench.report.plots._strategy_order"]


def test_systems_import_nothing_of_the_harness():
    graph = import_graph()
    offenders = [f"{m} -> {d}" for m, deps in graph.items() if m.startswith(("psbench.systems", "psbench.workloads",
                                                                            "psbench.core"))
                 for d in deps if d.startswith("psbench.bench")]
    assert not offenders


def test_a_module_path_is_its_file_path():
    """The source lies where its import path says, so a tool that knows nothing of packaging
    resolves every psbench.* import to its file: jedi here, as an editor's go-to-definition does,
    with the checkout as its project. The design card's top-level folders are relative links."""
    import jedi

    for folder in LINKED:
        link = ROOT / folder
        assert link.is_symlink() and os.readlink(link) == f"psbench/{folder}", link
    # This interpreter's own environment: jedi's default inspects it from a child process that
    # outlives the test (and the suite's checks that runs leave no process behind would see it).
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    project, environment = jedi.Project(ROOT), jedi.InterpreterEnvironment()
    unresolved = {}
    for module, path in source_modules().items():
        code = f"import {module}\n"
        found = jedi.Script(code, path=ROOT / "probe.py", project=project,
                            environment=environment).goto(1, len(code) - 2, follow_imports=True)
        if [Path(d.module_path) for d in found] != [path]:
            unresolved[module] = [str(d.module_path) for d in found]
    assert not unresolved
    assert {p.pid for p in psutil.Process().children(recursive=True)} <= before  # jedi left no process


def test_the_installed_packages_are_the_source_packages():
    """setuptools finds the packages through the links; nothing lists them by hand."""
    from setuptools import find_packages

    assert set(find_packages(str(ROOT), include=["psbench*"])) == {
        m for m, p in source_modules().items() if p.name == "__init__.py"}
    assert "package-dir" not in tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]


def test_every_module_imports_in_a_fresh_interpreter():
    modules = [m for m in source_modules() if not m.endswith("__main__")]
    code = "import importlib, sys\nfor m in sys.argv[1:]:\n    importlib.import_module(m)\n"
    proc = subprocess.run([sys.executable, "-c", code, *modules], capture_output=True, text=True, cwd="/")
    assert proc.returncode == 0, proc.stderr[-3000:]


@pytest.mark.parametrize("argv", [["--help"], ["list"], ["run", "--help"]])
def test_help_and_list_import_no_heavy_dependency(argv):
    """`psbench --help` and `psbench list` load neither torch nor pyspark, zmq or an adapter."""
    code = ("import sys\nfrom psbench.bench.cli import main\ntry:\n    main(sys.argv[1:])\nexcept SystemExit:\n    pass\n"
            "heavy = sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'pyspark', 'zmq', 'ray', 'horovod')"
            " or m.startswith('psbench.systems.') and m != 'psbench.systems.base')\n"
            "print('HEAVY', ' '.join(heavy))\n")
    proc = subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True, cwd="/")
    assert proc.returncode == 0, proc.stderr[-2000:]
    heavy = proc.stdout.rsplit("HEAVY", 1)[1].split()
    if argv == ["run", "--help"]:  # the per-system option groups need the adapters' Options
        assert "psbench.systems.ps.adapter" in heavy
    else:
        assert heavy == [], f"psbench {' '.join(argv)} imported {heavy[:8]}"
    assert "usage" in proc.stdout or "systems:" in proc.stdout


def test_no_issue_numbers_in_the_source():
    """History (which issue asked for what) belongs in commit messages: the tracker is not in the
    repository, so a number in a comment points nowhere."""
    import re

    pattern = re.compile(r"\bissues? ?#?\d+", re.IGNORECASE)
    files = [p for folder in ("psbench", "tests") for p in sorted((ROOT / folder).rglob("*"))
             if p.suffix in (".py", ".toml", ".sh") and ".venv" not in p.parts and "__pycache__" not in p.parts]
    files += [ROOT / "Makefile", ROOT / ".ci" / "run"]
    found = [f"{p.relative_to(ROOT)}:{n}" for p in files if p.is_file()
             for n, line in enumerate(p.read_text().splitlines(), 1) if pattern.search(line)]
    assert not found, found
