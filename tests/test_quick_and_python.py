"""The Python the project says it needs is one it runs on, and quick runs of an
experiment file land in their own suite folder, the one the README's example then reports on."""
from __future__ import annotations

import ast
import re
import shlex
import tomllib
from pathlib import Path

from packaging.specifiers import SpecifierSet

from psbench.bench import cli
from psbench.bench.harness.matrix import load_experiment

ROOT = Path(__file__).resolve().parent.parent
SOURCE_DIRS = ("psbench",)  # bench/, systems/, workloads/ are links into it
# Standard-library modules newer than the oldest Python anyone might declare here.
STDLIB_ADDED = {"tomllib": "3.11", "zoneinfo": "3.9", "graphlib": "3.9"}


def _imported_modules() -> dict[str, Path]:
    found: dict[str, Path] = {}
    for folder in SOURCE_DIRS:
        for file in (ROOT / folder).rglob("*.py"):
            for node in ast.walk(ast.parse(file.read_text())):
                if isinstance(node, ast.Import):
                    names = [a.name for a in node.names]
                elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                    names = [node.module]
                else:
                    continue
                for name in names:
                    found.setdefault(name.split(".")[0], file)
    return found


def test_requires_python_admits_no_version_that_lacks_an_imported_module() -> None:
    requires = SpecifierSet(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["requires-python"])
    for module, file in _imported_modules().items():
        added = STDLIB_ADDED.get(module)
        if added:
            major, minor = map(int, added.split("."))
            older = f"{major}.{minor - 1}"
            assert older not in requires, (f"{file.relative_to(ROOT)} imports {module} (Python {added}+) but "
                                           f"requires-python = '{requires}' admits {older}")


def test_readme_states_the_python_that_pyproject_requires() -> None:
    requires = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["requires-python"]
    stated = re.findall(r"Python (3\.\d+)\+", (ROOT / "README.md").read_text())
    assert stated and all(f">={v}" == requires for v in stated), (stated, requires)


def _readme_quick_example() -> tuple[list[str], str]:
    """The README's `psbench run --config X --quick` line and the suite folder its next line reports."""
    lines = [line.split("#")[0].strip() for line in (ROOT / "README.md").read_text().splitlines()]
    lines = [line for line in lines if line.startswith(".venv/bin/psbench ")]  # the example commands
    for i, line in enumerate(lines):
        words = shlex.split(line)
        if "--config" in words and "--quick" in words and words[1] == "run":
            report = next(shlex.split(n) for n in lines[i + 1:] if n.split()[1] == "report")
            return words, report[report.index("report") + 1]
    raise AssertionError("README has no `psbench run --config ... --quick` example")


def test_readme_quick_example_reports_the_folder_the_run_writes() -> None:
    words, reported = _readme_quick_example()
    experiment = load_experiment(ROOT / words[words.index("--config") + 1], quick=True)
    assert reported == f"results/{experiment.suite_folder}"
    assert experiment.suite_folder == f"{experiment.suite}-quick"


def test_quick_and_full_runs_of_one_file_go_to_separate_suites(tmp_path: Path) -> None:
    config = tmp_path / "tiny.toml"
    config.write_text('suite = "tiny"\n[matrix]\nsystem = ["single"]\nworkload = ["logreg-digits"]\n'
                      '[settings]\nmax_steps = 6\nevals_per_epoch = 1\n[quick]\nmax_steps = 3\n')
    results = tmp_path / "results"
    for extra in (["--quick"], []):
        assert cli.main(["run", "--config", str(config), "--results-dir", str(results), "--no-progress", *extra]) == 0
    assert sorted(p.name for p in results.iterdir()) == ["tiny", "tiny-quick"]
    assert cli.main(["report", str(results / "tiny-quick")]) == 0
    assert (results / "tiny-quick" / "report.html").is_file()
