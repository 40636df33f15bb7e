"""Metrics for taskgate (extra ``taskgate[prometheus]``): `Prometheus`, a middleware that
counts submits, runs, outcomes and errors, and reads queue depths and quotas from the store at
scrape. ``import taskgate.metrics`` works without ``prometheus_client``; building a
`Prometheus` needs it."""

from __future__ import annotations

from taskgate.metrics.prometheus import Prometheus

__all__ = ["Prometheus"]
