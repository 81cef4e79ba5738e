"""The README's findings table is the reference thesis.md's summary table, word for word (both from
bench/report/thesis.py summary_table); a front page of at most ~1,500 words besides that table."""
from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
START, END = "<!-- findings: the summary table of results/reference/thesis.md (psbench thesis) -->", "<!-- /findings -->"


def _summary(thesis_text: str) -> str:
    block = thesis_text.split("## Summary", 1)[1].split("\n## ", 1)[0]
    return "\n".join(line for line in block.splitlines() if line.startswith("|"))


def test_the_readme_findings_table_is_the_reference_thesis_summary():
    readme = (ROOT / "README.md").read_text()
    table = readme.split(START, 1)[1].split(END, 1)[0].strip()
    thesis = (ROOT / "results" / "reference" / "thesis.md").read_text()
    assert table == _summary(thesis) and table.count("\n") >= 2


def test_the_readme_is_a_front_page_and_its_links_resolve():
    readme = (ROOT / "README.md").read_text()
    without_table = readme.split(START, 1)[0] + readme.split(END, 1)[1]
    assert len(without_table.split()) <= 1500
    for page in ("commands", "cluster-conditions", "systems", "hosts", "experiments", "results", "reference"):
        assert f"](docs/{page}.md)" in readme and (ROOT / "docs" / f"{page}.md").is_file()
