"""Figures: one measured number, its floor and target, printed as a JSON line and a table row."""

from __future__ import annotations

import json
import statistics
import sys
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, TextIO

__all__ = ["Figure", "Target", "median", "percentile", "render_table"]


@dataclass(frozen=True)
class Target:
    """What a figure must reach: ``value >= minimum`` (rates) or ``value <= maximum`` (latencies).

    ``of_floor``: the minimum is this fraction of the figure's floor, not an absolute number.
    ``of_baseline``: ... a fraction of another figure of the same backend (named by ``baseline``).
    """

    minimum: float | None = None
    maximum: float | None = None
    of_floor: bool = False
    baseline: str | None = None

    def describe(self) -> str:
        """Short text for the table, e.g. ``>= 15000``, ``<= 2``, ``>= 70% floor``."""
        if self.maximum is not None:
            return f"<= {self.maximum:g}"
        assert self.minimum is not None
        if self.of_floor:
            return f">= {self.minimum:.0%} floor"
        if self.baseline is not None:
            return f">= {self.minimum:.0%} of {self.baseline}"
        return f">= {self.minimum:g}"


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
    target: str | None = None
    met: bool | None = None
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


def judge(figure: Figure, target: Target | None, lookup: Callable[[str], Figure | None]) -> None:
    """Fill ``figure.target``/``met`` from ``target`` (``lookup`` finds a baseline figure)."""
    if target is None or (target.of_floor and figure.floor is None):
        return
    figure.target = target.describe()
    if target.maximum is not None:
        figure.met = figure.value <= target.maximum
        return
    assert target.minimum is not None
    if target.of_floor:
        figure.met = None if figure.floor is None else figure.value >= target.minimum * figure.floor
        return
    if target.baseline is not None:
        base = lookup(target.baseline)
        if base is None or not base.value:
            return
        figure.met = figure.value >= target.minimum * base.value
        figure.note = (figure.note + " " if figure.note else "") + f"{figure.value / base.value:.0%} of base"
        return
    figure.met = figure.value >= target.minimum


def _number(value: float | None, unit: str = "") -> str:
    if value is None:
        return "—"
    if unit in ("ms",) or abs(value) < 100:
        return f"{value:.3g}" if abs(value) < 10 else f"{value:.1f}"
    return f"{value:,.0f}"


def render_table(figures: Iterable[Figure]) -> str:
    """A Markdown table of ``figures``: value, floor, ratio, target and whether it was met."""
    lines = [
        "| backend | figure | value | unit | raw floor | ratio | target | met | note |",
        "|---|---|--:|---|--:|--:|---|---|---|",
    ]
    for f in figures:
        floor = "—" if f.floor is None else f"{_number(f.floor, f.unit)} ({f.floor_name})"
        ratio = "—" if f.ratio is None else f"{f.ratio:.2f}"
        met = {True: "yes", False: "**no**", None: ""}[f.met]
        lines.append(
            f"| {f.backend} | {f.name} | {_number(f.value, f.unit)} | {f.unit} | {floor} | {ratio} "
            f"| {f.target or ''} | {met} | {f.note} |"
        )
    return "\n".join(lines)
