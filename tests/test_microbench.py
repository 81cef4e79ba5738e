"""The micro-benchmarks run under pytest-benchmark with both sides of each ratio
timed by its fixture; a saved run is compared with the next (`--benchmark-compare`,
`--benchmark-compare-fail`), as `make microbench` does; `psbench regress` gates their ratios."""
from __future__ import annotations

import json
from pathlib import Path

from psbench.bench.regress.check import RATIO_BENCHMARKS, resolve
from psbench.bench.regress.micro import CASES, ROUNDS, SIDES, micro_ratios, ratios_from_json, run_session

ROOT = Path(__file__).resolve().parent.parent
TIME_FIELDS = ("min", "max", "mean", "median", "stddev", "iqr", "q1", "q3", "ld15iqr", "hd15iqr", "total")


def test_both_sides_timed_saved_and_a_slowdown_fails_the_compare(tmp_path: Path) -> None:
    storage = f"--benchmark-storage=file://{tmp_path / 'store'}"
    rc, out = run_session(tmp_path / "first.json", select="wire",
                          extra=[storage, "--benchmark-save=first"])
    assert rc == 0, out[-2000:]
    data = json.loads((tmp_path / "first.json").read_text())
    timed = {(b["extra_info"]["case"], b["extra_info"]["side"]) for b in data["benchmarks"]}
    assert timed == {(c, s) for c in ("wire_encode", "wire_decode") for s in SIDES}
    assert set(data["psbench_ratios"]) == {"wire_encode", "wire_decode"}
    assert all(0 < r < 20 for r in data["psbench_ratios"].values())
    assert "psbench ratios" in out and "wire_decode" in out
    # Pretend the saved run was 10x faster: the next run, compared with it, is a regression.
    (saved,) = (tmp_path / "store").glob("*/0001_first.json")
    old = json.loads(saved.read_text())
    for bench in old["benchmarks"]:
        for key in TIME_FIELDS:
            bench["stats"][key] /= 10
    saved.write_text(json.dumps(old))
    rc, out = run_session(tmp_path / "second.json", select="wire",
                          extra=[storage, "--benchmark-compare=0001", "--benchmark-compare-fail=min:50%"])
    assert rc != 0 and "Performance has regressed" in out, out[-2000:]


def test_ratios_pair_the_sides_of_each_case() -> None:
    bench = lambda case, side, t: {"extra_info": {"case": case, "side": side}, "stats": {"min": t}}  # noqa: E731
    data = {"benchmarks": [bench("a", "psbench", 2.0), bench("a", "reference", 1.0), bench("b", "psbench", 1.0)]}
    assert ratios_from_json(data) == {"a": 0.5}  # b has one side only: no ratio


def test_make_microbench_saves_and_compares() -> None:
    makefile = (ROOT / "Makefile").read_text()
    recipe = makefile[makefile.index("microbench: setup"):].split("\n\n")[0]
    for flag in ("tests/microbench", "--benchmark-enable", "--benchmark-autosave", "--benchmark-compare",
                 "--benchmark-compare-fail"):
        assert flag in recipe, flag


def test_regress_gates_the_micro_ratios() -> None:
    assert RATIO_BENCHMARKS["micro"] == "psbench.bench.regress.micro:micro_ratios"
    [(prefix, fn)] = resolve("micro")
    assert prefix == "micro" and fn is micro_ratios
    assert set(CASES) == set(ROUNDS) == {"wire_encode", "wire_decode", "roundtrip_1mb", "roundtrip_10mb",
                                         "shard_apply", "train_step"}
