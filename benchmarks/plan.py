"""What is measured per backend: each group's figures, their floors and the issue's targets."""

from __future__ import annotations

from dataclasses import dataclass, field

from benchmarks.results import Target

__all__ = ["GROUPS", "PROCESS_TARGETS", "FigureSpec", "spec_of"]

GROUPS = ("floor", "submit", "process", "latency", "claims", "limits", "rss")

# Processing no-op tasks with one worker process (workers=10), tasks/s.
PROCESS_TARGETS = {"postgresql": 15_000, "redis": 10_000, "mariadb": 6_000, "sqlite": 7_000, "memory": 50_000}
SINGLE_SUBMIT_SHARE = 0.70  # of the floor's single insert
SUBMIT_MANY_TARGET = 50_000  # tasks/s, PostgreSQL and Redis
SAME_PROCESS_P50_MS = 2.0
CROSS_PROCESS_P50_MS = 10.0  # PostgreSQL (LISTEN/NOTIFY) and Redis
BIG_STORE_SHARE = 0.80  # 1M finished tasks cost at most 20 % of claim throughput
LIMITS_SHARE = 0.85  # limits set but not binding cost at most 15 %

LATENCY_FLOOR = "idle_rt"  # one raw insert plus one raw claim after an idle pause, in ms


@dataclass(frozen=True)
class FigureSpec:
    """How to present a figure: unit, which floor it is compared with, its target per backend."""

    unit: str
    floor: str | None = None
    targets: dict[str, Target] = field(default_factory=dict)
    default_target: Target | None = None

    def target(self, backend: str) -> Target | None:
        """The target for ``backend``, if the issue sets one."""
        return self.targets.get(backend, self.default_target)


def _per_backend(values: dict[str, float]) -> dict[str, Target]:
    return {backend: Target(minimum=v) for backend, v in values.items()}


_SPECS: dict[str, FigureSpec] = {
    # The target is judged on the paired figure: its floor is measured alternated with it.
    "submit.single": FigureSpec("tasks/s", "insert1"),
    "submit.single.paired": FigureSpec(
        "tasks/s", "insert1", default_target=Target(minimum=SINGLE_SUBMIT_SHARE, of_floor=True)
    ),
    "submit.batch": FigureSpec(
        "tasks/s", "insert_batch", _per_backend(dict.fromkeys(("postgresql", "redis"), SUBMIT_MANY_TARGET))
    ),
    "process.w10": FigureSpec("tasks/s", "work10", _per_backend(PROCESS_TARGETS)),
    "process.w100": FigureSpec("tasks/s", "work10"),
    "process.2proc.w10": FigureSpec("tasks/s", "work10"),
    "latency.same.p50": FigureSpec("ms", LATENCY_FLOOR, default_target=Target(maximum=SAME_PROCESS_P50_MS)),
    "latency.same.p99": FigureSpec("ms", LATENCY_FLOOR),
    "latency.cross.p50": FigureSpec(
        "ms",
        LATENCY_FLOOR,
        {b: Target(maximum=CROSS_PROCESS_P50_MS) for b in ("postgresql", "redis")},
    ),
    "latency.cross.p99": FigureSpec("ms", LATENCY_FLOOR),
    "claims.small_finished": FigureSpec("tasks/s", "work10"),
    "claims.big_finished": FigureSpec(
        "tasks/s", "work10", default_target=Target(minimum=BIG_STORE_SHARE, baseline="claims.small_finished")
    ),
    "limits.none": FigureSpec("tasks/s", "work10"),
    "memory.rss": FigureSpec("MB"),
}
for _variant in ("rps", "quota", "deps"):
    _SPECS[f"limits.{_variant}"] = FigureSpec(
        "tasks/s", "work10", default_target=Target(minimum=LIMITS_SHARE, baseline="limits.none")
    )
for _floor in ("insert1", "insert_batch", "claim1", "claim100", "work10"):
    _SPECS[f"floor.{_floor}"] = FigureSpec("jobs/s")
_SPECS["floor.idle_rt"] = FigureSpec("ms")


def spec_of(name: str) -> FigureSpec:
    """The presentation of figure ``name``."""
    return _SPECS[name]
