"""The thesis' claims are typed once (bench/report/claims.py) and verdicts print as the words they
always printed."""
from __future__ import annotations

import ast
from pathlib import Path

from psbench.bench.report import claims
from psbench.bench.report.claims import KASSELA, SHARDING, Verdict

REPORT = Path(__file__).resolve().parent.parent / "bench" / "report"


def test_verdicts_print_as_their_words():
    assert [f"{v}" for v in Verdict] == ["reproduced", "not reproduced", "inconclusive", "shown, not the verdict"]
    assert f"{Verdict.INCONCLUSIVE:>15}|**{Verdict.REPRODUCED}**" == "   inconclusive|**reproduced**"


def figures_typed(path: Path) -> list[str]:
    """The papers' figures written as literals in a module's code (docstrings and comments aside)."""
    figures = {KASSELA.ps_fall, KASSELA.spark_fall, SHARDING.distribution_aware, SHARDING.stratified}
    words = [f"{x:g}x" for x in figures]
    tree = ast.parse(path.read_text())
    docstrings = {id(n.body[0].value) for n in ast.walk(tree)
                  if isinstance(n, (ast.Module, ast.FunctionDef, ast.ClassDef)) and n.body
                  and isinstance(n.body[0], ast.Expr) and isinstance(n.body[0].value, ast.Constant)}
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Constant) or id(node) in docstrings:
            continue
        if isinstance(node.value, float) and node.value in figures:
            found.append(f"{path.name}:{node.lineno}: {node.value}")
        elif isinstance(node.value, str) and any(w in node.value for w in words):
            found.append(f"{path.name}:{node.lineno}: {node.value[:60]!r}")
    return found


def test_the_papers_figures_are_typed_only_in_claims():
    typed = [hit for path in sorted(REPORT.glob("*.py")) if path.name != "claims.py" for hit in figures_typed(path)]
    assert not typed, "the papers' figures typed outside claims.py:\n" + "\n".join(typed)
    assert figures_typed(Path(claims.__file__))  # the check sees them where they are typed


def test_the_claim_reaches_both_documents():
    from psbench.bench.report import document, tables, variance_power

    assert "14x" in document.PLOT_CAPTIONS["step_time_vs_batch"] and "1.36x" in KASSELA.paper
    assert ">= 10x" in tables.CAPTIONS["fall"].text and "<= 1.5x" in tables.CAPTIONS["fall"].text
    assert variance_power.PAPER_RATIOS == (8.48, 6.11) and variance_power.PAPER_RUNS == SHARDING.runs == 5
