"""Report cells and Markdown tables, written one way for every document (a suite's report, the
scale model's, thesis.md's sections)."""
from __future__ import annotations

import math
from typing import Any

import numpy as np
import pandas as pd


def missing(value: Any) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value))


def fmt_cell(value: Any) -> str:
    if missing(value):
        return "–"
    if isinstance(value, (bool, np.bool_)):
        return "yes" if value else "no"
    if isinstance(value, (int, np.integer)):
        return str(int(value))
    if isinstance(value, (float, np.floating)):
        v = float(value)
        if v == 0:
            return "0"
        if math.isinf(v):
            return "∞" if v > 0 else "-∞"
        if abs(v) >= 1e6:
            return f"{v:.3g}"
        if abs(v) >= 1000:
            return f"{v:,.0f}"
        if abs(v) >= 1:
            return f"{v:.3g}" if abs(v) < 100 else f"{v:.0f}"
        return f"{v:.3g}" if abs(v) >= 1e-3 else f"{v:.2e}"
    return str(value)


def frame_strings(frame: pd.DataFrame) -> pd.DataFrame:
    return frame.apply(lambda col: col.map(fmt_cell)) if len(frame) else frame


def markdown_table(frame: pd.DataFrame) -> str:
    """A table in Markdown, its cells written as the report writes them (fmt_cell); '_(none)_' when empty.
    The one writer: the suite reports, the scale model's and thesis.md's sections use it."""
    if frame.empty:
        return "_(none)_"
    cells = frame_strings(frame)
    esc = lambda s: str(s).replace("|", "\\|")  # noqa: E731
    lines = ["| " + " | ".join(esc(c) for c in cells.columns) + " |", "|" + "|".join("---" for _ in cells.columns) + "|"]
    lines += ["| " + " | ".join(esc(v) for v in row) + " |" for _, row in cells.iterrows()]
    return "\n".join(lines)
