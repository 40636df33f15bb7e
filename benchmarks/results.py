"""Figures: one measured number and its floor, printed as a JSON line and a table row."""

from __future__ import annotations

import json
import statistics
import sys
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, TextIO

__all__ = ["Figure", "median", "note_baseline", "percentile", "render_table"]


@dataclass
class Figure:
    """One measured figure of one backend; ``value`` is the median of ``samples``."""

    backend: str
    name: str
    value: float
    unit: str
    samples: list[float] = field(default_factory=list)
    params: dict[str, Any] = field(default_factory=dict)
    floor_name: str | None = None
    floor: float | None = None
    ratio: float | None = None
    note: str = ""

    def json_line(self) -> str:
        """The figure as one compact JSON line."""
        return json.dumps({"kind": "figure", **asdict(self)}, separators=(",", ":"))

    def emit(self, out: TextIO = sys.stdout) -> None:
        """Print the JSON line now, so a long run shows progress and a killed run keeps figures."""
        out.write(self.json_line() + "\n")
        out.flush()


def median(values: Sequence[float]) -> float:
    """The median, 0.0 for no values."""
    return float(statistics.median(values)) if values else 0.0


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0-100) by nearest rank; 0.0 for no values."""
    if not values:
        return 0.0
    ordered = sorted(values)
    rank = max(0, min(len(ordered) - 1, round(q / 100 * len(ordered) + 0.5) - 1))
    return float(ordered[rank])


def note_baseline(figure: Figure, base: Figure | None) -> None:
    """Add to ``figure``'s note its share of ``base`` (the same backend's figure without what
    this one adds); nothing when that was not measured."""
    if base is None or not base.value:
        return
    figure.note = (figure.note + " " if figure.note else "") + f"{figure.value / base.value:.0%} of base"


def _number(value: float | None, unit: str = "") -> str:
    if value is None:
        return "—"
    if unit in ("ms",) or abs(value) < 100:
        return f"{value:.3g}" if abs(value) < 10 else f"{value:.1f}"
    return f"{value:,.0f}"


def render_table(figures: Iterable[Figure]) -> str:
    """A Markdown table of ``figures``: value, floor, ratio to it, and note."""
    lines = [
        "| backend | figure | value | unit | raw floor | ratio | note |",
        "|---|---|--:|---|--:|--:|---|",
    ]
    for f in figures:
        floor = "—" if f.floor is None else f"{_number(f.floor, f.unit)} ({f.floor_name})"
        ratio = "—" if f.ratio is None else f"{f.ratio:.2f}"
        lines.append(
            f"| {f.backend} | {f.name} | {_number(f.value, f.unit)} | {f.unit} | {floor} | {ratio} "
            f"| {f.note} |"
        )
    return "\n".join(lines)
