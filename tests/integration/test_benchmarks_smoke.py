"""The benchmark harness still runs: a tiny run on the memory backend (about a second)."""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

from taskgate.brokers.sql import SQLBroker

ROOT = Path(__file__).resolve().parents[2]


def _stdout_of(module: str, *args: str, timeout: float, **env: str) -> str:
    """What ``python -m module args`` printed, run from the checkout; it must exit 0."""
    done = subprocess.run(
        [sys.executable, "-m", module, *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **env},
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_the_benchmark_harness_prints_every_memory_figure_and_a_table() -> None:
    stdout = _stdout_of("benchmarks", "--tiny", "--backend", "memory", timeout=90)
    lines = [json.loads(line) for line in stdout.splitlines() if line.startswith("{")]
    figures = {line["name"]: line for line in lines if line["kind"] == "figure"}
    assert lines[0]["kind"] == "run"
    assert not [line for line in lines if line["kind"] == "error"]
    expected = {
        "submit.single", "submit.batch", "process.w10", "process.w100", "latency.same.p50",
        "latency.same.p99", "claims.small_finished", "claims.big_finished", "claims.pruning",
        "limits.none", "limits.local", "limits.rps", "limits.quota", "limits.deps", "limits.priorities",
        "memory.rss",
    }  # fmt: skip
    assert set(figures) == expected
    assert all(f["value"] > 0 and f["backend"] == "memory" for f in figures.values())
    assert "| memory | process.w10 |" in stdout
    assert figures["limits.rps"]["note"].endswith("of base")  # compared with limits.none


def test_the_paired_single_submit_is_divided_by_the_floor_measured_with_it() -> None:
    stdout = _stdout_of("benchmarks", "--tiny", "--backend", "sqlite", "--only", "submit", timeout=90)
    lines = [json.loads(line) for line in stdout.splitlines() if line.startswith("{")]
    figures = {line["name"]: line for line in lines if line["kind"] == "figure"}
    paired, group_floor = figures["submit.single.paired"], figures["floor.insert1"]
    assert paired["floor_name"] == "insert1"
    assert paired["floor"] == statistics.median(paired["params"]["floor_samples"]) != group_floor["value"]
    assert paired["ratio"] == paired["value"] / paired["floor"]
    assert not {"target", "met"} & set(paired)  # the absolute targets are retired
    cpu = paired["params"]["cpu_us_per_call"]  # [ours, floor] per repeat: where the gap is spent
    assert len(cpu) == len(paired["params"]["floor_samples"])
    assert all(ours > 0 and raw > 0 for ours, raw in cpu)


def test_the_cycle_trace_shows_claims_ack_writes_and_runs_in_time_order() -> None:
    stdout = _stdout_of(
        "benchmarks.cycletrace", "--backend", "memory", "-n", "300", "--show", "40", timeout=60
    )
    rows = [line.split() for line in stdout.splitlines()]
    assert len(rows) == 40
    times = [float(row[0]) for row in rows]
    assert times == sorted(times) and times[0] == 0.0
    kinds = {row[2] for row in rows}
    assert "run" in kinds and kinds <= {"run", "claim>", "claim<", "ack>", "ack<"}


@pytest.mark.parametrize(("backend", "what"), [("redis", "submit"), ("redis", "get"), ("pg", "latency")])
def test_the_split_calls_a_b_runs_both_sides(backend: str, what: str) -> None:
    args = ("--backend", backend, "--what", what, "--rounds", "2", "-n", "20")
    stdout = _stdout_of("benchmarks.splitcalls", *args, timeout=120)
    lines = stdout.splitlines()
    assert [line.split()[:2] for line in lines[:2]] == [[what, "split"], [what, "threads"]]
    assert all(float(line.split()[3].replace(",", "")) > 0 for line in lines[:2])
    assert lines[2].startswith("split vs threads (above 1: split faster), paired: median ")


def test_the_thread_side_of_the_split_calls_a_b_splits_nothing(
    postgresql_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The A/B's two sides are what they claim: only the split side declares split calls."""
    monkeypatch.syspath_prepend(str(ROOT))  # benchmarks/ is not installed, only checked out
    from benchmarks.splitcalls import SQLThreadHops, ThreadHops

    assert not ThreadHops.capabilities.split_calls
    for broker_class, splits in ((SQLThreadHops, False), (SQLBroker, True)):
        broker = broker_class(postgresql_url)
        try:
            assert broker.capabilities.split_calls is splits
        finally:
            broker.close()


def test_the_api_calls_benchmark_prints_a_line_per_backend_and_call() -> None:
    args = ("--backend", "memory,sqlite", "-n", "20", "--repeats", "1")
    stdout = _stdout_of("benchmarks.calls", *args, timeout=120)
    lines = [line.split() for line in stdout.splitlines()]
    calls = ["get", "list", "submit", "submit_key", "submit_child", "cancel"]
    assert [words[:2] for words in lines] == [[b, c] for b in ("memory", "sqlite") for c in calls]
    assert all(float(words[2].rstrip("/s").replace(",", "")) > 0 for words in lines)


def test_the_transitions_benchmark_prints_a_line_per_backend() -> None:
    stdout = _stdout_of("benchmarks.transitions", "--backend", "memory,sqlite", "-n", "20", timeout=120)
    lines = [line.split() for line in stdout.splitlines()]
    assert [(words[0], words[1], words[3]) for words in lines] == [
        ("memory", "cancel", "claim+retry"),
        ("sqlite", "cancel", "claim+retry"),
    ]
    assert all(float(words[k].rstrip("/s").replace(",", "")) > 0 for words in lines for k in (2, 4))


@pytest.mark.parametrize("what", ["submit", "latency"])
def test_the_held_connection_a_b_runs_both_sides_on_postgresql(what: str) -> None:
    stdout = _stdout_of("benchmarks.heldconn", "--what", what, "--rounds", "2", "-n", "20", timeout=120)
    lines = stdout.splitlines()
    assert [line.split()[:2] for line in lines[:2]] == [[what, "held"], [what, "pooled"]]
    assert all(float(line.split()[3].replace(",", "")) > 0 for line in lines[:2])
    assert lines[2].startswith("held vs pooled (above 1: held faster), paired: median ")


def test_the_pooled_side_of_the_held_connection_a_b_takes_the_pool_s_connection(
    postgresql_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The A/B's two sides are what they claim: the pooled side checks a connection out of the
    pool for a call; the broker's own held connection is outside the pool."""
    monkeypatch.syspath_prepend(str(ROOT))  # benchmarks/ is not installed, only checked out
    from benchmarks.heldconn import PooledCalls

    for broker_class, checked_out in ((PooledCalls, 1), (SQLBroker, 0)):
        broker = broker_class(postgresql_url)
        try:
            with broker._statement_connection():
                assert broker._engine.pool.checkedout() == checked_out, broker_class
            assert broker._engine.pool.checkedout() == 0
        finally:
            broker.close()
