"""What is measured per backend: each group's figures, their floors and their baselines."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["GROUPS", "FigureSpec", "spec_of"]

GROUPS = ("floor", "submit", "process", "latency", "claims", "limits", "rss")

LATENCY_FLOOR = "idle_rt"  # one raw insert plus one raw claim after an idle pause, in ms


@dataclass(frozen=True)
class FigureSpec:
    """How to present a figure: its unit, which floor it is divided by, and which figure of the
    same backend its note compares it with (``baseline``: the same work without the thing this
    one adds, e.g. limits set but not binding)."""

    unit: str
    floor: str | None = None
    baseline: str | None = None


_SPECS: dict[str, FigureSpec] = {
    "submit.single": FigureSpec("tasks/s", "insert1"),
    "submit.single.paired": FigureSpec("tasks/s", "insert1"),
    "submit.batch": FigureSpec("tasks/s", "insert_batch"),
    "process.w10": FigureSpec("tasks/s", "work10"),
    "process.w100": FigureSpec("tasks/s", "work10"),
    "process.2proc.w10": FigureSpec("tasks/s", "work10"),
    "latency.same.p50": FigureSpec("ms", LATENCY_FLOOR),
    "latency.same.p99": FigureSpec("ms", LATENCY_FLOOR),
    "latency.cross.p50": FigureSpec("ms", LATENCY_FLOOR),
    "latency.cross.p99": FigureSpec("ms", LATENCY_FLOOR),
    "claims.small_finished": FigureSpec("tasks/s", "work10"),
    "claims.big_finished": FigureSpec("tasks/s", "work10", baseline="claims.small_finished"),
    "claims.pruning": FigureSpec("tasks/s", "work10", baseline="claims.small_finished"),
    "limits.none": FigureSpec("tasks/s", "work10"),
    "memory.rss": FigureSpec("MB"),
}
for _variant in ("local", "rps", "quota", "deps", "priorities"):
    _SPECS[f"limits.{_variant}"] = FigureSpec("tasks/s", "work10", baseline="limits.none")
for _floor in ("insert1", "insert_batch", "claim1", "claim100", "work10"):
    _SPECS[f"floor.{_floor}"] = FigureSpec("jobs/s")
_SPECS["floor.idle_rt"] = FigureSpec("ms")


def spec_of(name: str) -> FigureSpec:
    """The presentation of figure ``name``."""
    return _SPECS[name]
