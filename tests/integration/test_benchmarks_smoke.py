"""The benchmark harness still runs: a tiny run on the memory backend (about a second)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_benchmark_harness_prints_every_memory_figure_and_a_table() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks", "--tiny", "--backend", "memory"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=90,
    )
    assert done.returncode == 0, done.stderr
    lines = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    figures = {line["name"]: line for line in lines if line["kind"] == "figure"}
    assert lines[0]["kind"] == "run"
    assert not [line for line in lines if line["kind"] == "error"]
    expected = {
        "submit.single", "submit.batch", "process.w10", "process.w100", "latency.same.p50",
        "latency.same.p99", "claims.small_finished", "claims.big_finished", "limits.none",
        "limits.rps", "limits.quota", "limits.deps", "memory.rss",
    }  # fmt: skip
    assert set(figures) == expected
    assert all(f["value"] > 0 and f["backend"] == "memory" for f in figures.values())
    assert "| memory | process.w10 |" in done.stdout


def test_the_cycle_trace_shows_claims_ack_writes_and_runs_in_time_order() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.cycletrace", "--backend", "memory", "-n", "300", "--show", "40"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    rows = [line.split() for line in done.stdout.splitlines()]
    assert len(rows) == 40
    times = [float(row[0]) for row in rows]
    assert times == sorted(times) and times[0] == 0.0
    kinds = {row[2] for row in rows}
    assert "run" in kinds and kinds <= {"run", "claim>", "claim<", "ack>", "ack<"}


def test_the_bytecode_count_names_the_runtime_and_repeats_exactly() -> None:
    def count() -> list[str]:
        done = subprocess.run(
            [sys.executable, "-m", "benchmarks.opcount", "--backend", "memory", "-n", "200", "--top", "15"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=60,
            env={**os.environ, "PYTHONHASHSEED": "0"},
        )
        assert done.returncode == 0, done.stderr
        return done.stdout.splitlines()

    def per_task(lines: list[str]) -> float:
        assert lines[0].endswith("bytecodes per task")
        return float(lines[0].split()[0].replace(",", ""))

    first = count()
    assert per_task(first) > 0
    assert any("taskgate/runtime/" in line for line in first[1:])
    assert len(first) == 16
    # A count, not a timing: a second run differs by a poll wake-up or two at most.
    assert abs(per_task(count()) - per_task(first)) <= 0.02 * per_task(first)
