"""The HTML report opened in headless Chromium (Debian's package) as a reader
would: it loads with no console error, every image loads, and a screenshot lands beside it.
Without Chromium this is a skip naming the fix, except in CI (.ci/run installs it), where it fails."""
from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from psbench.bench.cli import main
from psbench.bench.harness.results import load_suite
from psbench.bench.report.browser import check_page, chromium_path
from report_fixtures import build_fixture_suite

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"

if chromium_path() is None and not os.environ.get("CI"):
    pytest.skip("chromium not installed: apt-get install -y chromium (or bash .ci/install-chromium.sh)",
                allow_module_level=True)


@pytest.fixture(scope="module")
def suite(tmp_path_factory) -> Path:
    return build_fixture_suite(tmp_path_factory.mktemp("browser"))


def test_report_loads_cleanly_with_every_image_and_a_screenshot(suite: Path, capsys) -> None:
    assert main(["report", str(suite), "--browser-check"]) == 0, capsys.readouterr().out
    shot = suite / "report.png"
    assert shot.read_bytes()[:8] == PNG_MAGIC and shot.stat().st_size > 50_000
    check = check_page(suite / "report.html")
    assert check.title == f"psbench report: suite {suite.name}"
    assert len(check.images) == len(list((suite / "plots").glob("*.png"))) >= 6
    assert check.ok and all(i["width"] > 200 and i["height"] > 100 for i in check.images)
    assert len(load_suite(suite).runs) > 0  # the screenshot beside the report does not break the suite


def test_the_check_sees_broken_images_and_console_errors(suite: Path, tmp_path: Path, capsys) -> None:
    """The same report with one image's data cut and a script error: both are caught."""
    bad = tmp_path / "s"
    shutil.copytree(suite, bad)
    plot = sorted((bad / "plots").glob("*.png"))[0]
    plot.write_bytes(b"AAAA" + plot.read_bytes()[4000:])  # a PNG without its header
    html = (bad / "report.html").read_text()
    html = html.replace("</body>", "<script>console.error('boom'); undefinedCall();</script></body>")
    (bad / "report.html").write_text(html)
    check = check_page(bad / "report.html", bad / "shot.png")
    assert len(check.broken_images) == 1 and not check.ok
    assert any("boom" in e for e in check.errors) and any("undefinedCall" in e for e in check.errors)
    assert (bad / "shot.png").read_bytes()[:8] == PNG_MAGIC
