"""How big a run is: the full run of the issue (10,000 jobs, medians of 3) or ``--quick``."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Settings"]


@dataclass(frozen=True)
class Settings:
    """Sizes of one run; every figure's JSON line records the ones it used."""

    n: int = 10_000  # jobs per throughput run (submit, processing, claims, floors)
    repeats: int = 3  # runs per throughput figure; the figure is their median
    batch: int = 1_000  # payloads per submit_many call
    batch_jobs: int = 50_000  # jobs per submit_many run (fast enough to need more than n)
    latency_samples: int = 60  # submits per latency run, spaced at low load
    latency_gap: tuple[float, float] = (0.03, 0.09)  # seconds between submits (uniform)
    small_finished: int = 10_000  # finished tasks in the store, claim baseline
    big_finished: int = 1_000_000  # ... and the large store
    pruning_finished: int = 100_000  # ... and the store pruned while it is drained
    fill_budget: float = 60.0  # seconds allowed to build the large store (then stop, and say so)
    rss_tasks: int = 1_000_000  # pending tasks held by the memory broker for the RSS figure
    # Seconds one measured run may last: a slow backend then reports the rate of what it did
    # in that time (its JSON line says how many), which keeps a full run near 15 minutes.
    run_cap: float = 4.0

    @classmethod
    def quick(cls) -> Settings:
        """A fast run (about a minute per backend) for checking the harness, not for the README."""
        return cls(
            n=1_000,
            repeats=1,
            batch_jobs=5_000,
            latency_samples=20,
            small_finished=1_000,
            big_finished=50_000,
            pruning_finished=20_000,
            fill_budget=15.0,
            rss_tasks=100_000,
            run_cap=3.0,
        )

    @classmethod
    def tiny(cls) -> Settings:
        """Seconds per backend: the smoke test's size."""
        return cls(
            n=100,
            repeats=1,
            batch=50,
            batch_jobs=200,
            latency_samples=5,
            latency_gap=(0.005, 0.01),
            small_finished=50,
            big_finished=200,
            pruning_finished=200,
            fill_budget=5.0,
            rss_tasks=2_000,
            run_cap=2.0,
        )
