"""The runner: ``python -m benchmarks [--quick] [--backend …] [--only …]``.

Per backend, in order: the raw-driver floors of its server, then each selected group. Every
figure is printed as one JSON line as soon as it is measured (stdout); progress goes to
stderr; a Markdown table of all figures ends the run (also written to ``--table``).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import socket
import sys
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import asdict, replace
from datetime import UTC, datetime
from typing import Any

from benchmarks import claims, latency, processing, submit
from benchmarks.floors import FLOOR_NAMES, measure_floors
from benchmarks.plan import GROUPS, spec_of
from benchmarks.results import Figure, median, note_baseline, percentile, render_table
from benchmarks.settings import Settings
from benchmarks.stores import BACKENDS, CROSS_PROCESS, isolated_store, server_address

__all__ = ["ALIASES", "choose", "main"]

ALIASES = {"pg": "postgresql", "postgres": "postgresql", "mysql": "mariadb", "mem": "memory"}


def _log(message: str) -> None:
    sys.stderr.write(f"[bench {time.strftime('%H:%M:%S')}] {message}\n")
    sys.stderr.flush()


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    """The command line; see ``--help``."""
    p = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__.split("\n\n")[0])
    p.add_argument("--backend", default=",".join(BACKENDS), help="comma list: memory,sqlite,pg,mariadb,redis")
    p.add_argument("--only", default=",".join(GROUPS), help=f"comma list of groups: {','.join(GROUPS)}")
    p.add_argument("--quick", action="store_true", help="small sizes, one repeat: checks the harness")
    p.add_argument("--tiny", action="store_true", help="seconds per backend (the smoke test)")
    p.add_argument("-n", type=int, help="jobs per throughput run (default 10000)")
    p.add_argument("--repeats", type=int, help="runs per throughput figure (median reported)")
    p.add_argument("--table", help="also write the Markdown table to this file")
    return p.parse_args(argv)


def choose(text: str, known: Sequence[str], what: str) -> list[str]:
    """The comma-separated names in ``text`` (backend aliases resolved), each one of ``known``;
    exits naming the unknown ones otherwise. ``what`` names them in that message."""
    chosen = [ALIASES.get(x.strip(), x.strip()) for x in text.split(",") if x.strip()]
    unknown = [x for x in chosen if x not in known]
    if unknown:
        raise SystemExit(f"unknown {what}: {', '.join(unknown)} (known: {', '.join(known)})")
    return chosen


def settings_from(args: argparse.Namespace) -> Settings:
    """The run's sizes from the command line."""
    s = Settings.tiny() if args.tiny else Settings.quick() if args.quick else Settings()
    if args.n:
        s = replace(s, n=args.n)
    if args.repeats:
        s = replace(s, repeats=args.repeats)
    return s


def _commit() -> str:
    """The checked-out commit (with ``+dirty`` if taskgate/ has changes), or ``unknown``."""
    import subprocess

    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
        dirty = subprocess.run(["git", "status", "--porcelain", "taskgate"], capture_output=True, text=True)
    except OSError:
        return "unknown"
    return head.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "") or "unknown"


def _reachable(backend: str) -> str | None:
    address = server_address(backend)
    if address is None:
        return None
    try:
        with socket.create_connection(address, timeout=2):
            return None
    except OSError as exc:
        return f"{backend} not reachable at {address[0]}:{address[1]} ({exc})"


class Run:
    """One benchmark run: collects figures per backend and prints them."""

    def __init__(self, settings: Settings, groups: list[str]) -> None:
        self.s = settings
        self.groups = groups
        self.figures: list[Figure] = []
        self.floors: dict[str, dict[str, float]] = {}
        self.errors = 0

    def header(self, backends: list[str]) -> None:
        """Print the run's context as the first JSON line."""
        line = {
            "kind": "run",
            "started": datetime.now(UTC).isoformat(timespec="seconds"),
            "loadavg": os.getloadavg(),
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "commit": _commit(),
            "backends": backends,
            "groups": self.groups,
            "settings": asdict(self.s),
        }
        print(json.dumps(line), flush=True)

    def backend(self, backend: str) -> None:
        """Measure every selected group on ``backend``."""
        why = _reachable(backend)
        if why is not None:
            _log(f"skip {backend}: {why}")
            print(json.dumps({"kind": "skip", "backend": backend, "reason": why}), flush=True)
            return
        self._guard(backend, "floor", self._floors)
        for group in self.groups:
            if group != "floor":
                self._guard(backend, group, getattr(self, f"_{group}"))

    def _guard(self, backend: str, group: str, fn: Callable[[str], None]) -> None:
        _log(f"{backend}: {group}")
        try:
            fn(backend)
        except Exception as exc:
            self.errors += 1
            _log(f"{backend}: {group} FAILED: {exc!r}\n{traceback.format_exc()}")
            print(
                json.dumps({"kind": "error", "backend": backend, "group": group, "error": repr(exc)}),
                flush=True,
            )

    def add(
        self,
        backend: str,
        name: str,
        samples: list[float],
        *,
        value: float | None = None,
        floor: float | None = None,
        **extra: Any,
    ) -> None:
        """Record figure ``name`` (value = median of samples unless given) and print its line.

        ``floor``: the value of the figure's floor measured with it, instead of the floor group's.
        """
        spec = spec_of(name)
        fig = Figure(backend, name, median(samples) if value is None else value, spec.unit, list(samples))
        fig.params = {k: v for k, v in extra.items() if k != "note"}
        fig.note = extra.get("note", "")
        if floor is None:
            floor = self._floor_value(backend, spec.floor)
        if floor:
            fig.floor_name, fig.floor, fig.ratio = spec.floor, floor, fig.value / floor
        if spec.baseline is not None:
            note_baseline(fig, self._find(backend, spec.baseline))
        self.figures.append(fig)
        fig.emit()

    def _find(self, backend: str, name: str) -> Figure | None:
        return next((f for f in self.figures if f.backend == backend and f.name == name), None)

    def _floor_value(self, backend: str, name: str | None) -> float | None:
        floors = self.floors.get(backend, {})
        return floors.get(name) if name else None

    # -- groups ----------------------------------------------------------------------------

    def _floors(self, backend: str) -> None:
        if "floor" not in self.groups and not set(self.groups) & {"submit", "process", "latency", "claims"}:
            return
        runs: list[dict[str, float]] = []
        for _ in range(self.s.repeats):
            with isolated_store(backend) as store:
                measured = measure_floors(store, self.s.n, self.s.run_cap / 3, self.s.latency_gap)
            if not measured:
                return
            runs.append(measured)
        self.floors[backend] = {k: median([r[k] for r in runs]) for k in FLOOR_NAMES}
        for k in FLOOR_NAMES:
            self.add(backend, f"floor.{k}", [r[k] for r in runs], n=self.s.n)

    def _submit(self, backend: str) -> None:
        self.add(backend, "submit.single", submit.submit_single(backend, self.s), n=self.s.n)
        pairs = submit.submit_single_paired(backend, self.s)
        if pairs:
            ratios = " ".join(f"{pair.ours / pair.floor:.2f}" for pair in pairs)
            cpu = " ".join(f"{pair.ours_cpu_us:.0f}/{pair.floor_cpu_us:.0f}" for pair in pairs)
            self.add(
                backend,
                "submit.single.paired",
                [pair.ours for pair in pairs],
                floor=median([pair.floor for pair in pairs]),
                n=self.s.n,
                rounds=submit.PAIRED_ROUNDS,
                floor_samples=[pair.floor for pair in pairs],
                cpu_us_per_call=[[round(pair.ours_cpu_us, 1), round(pair.floor_cpu_us, 1)] for pair in pairs],
                note=f"insert1 alternated with it; per repeat {ratios}; CPU µs a call, ours/floor {cpu}",
            )
        self.add(
            backend,
            "submit.batch",
            submit.submit_batch(backend, self.s),
            n=self.s.batch_jobs,
            batch=self.s.batch,
        )

    def _process(self, backend: str) -> None:
        for workers in (10, 100):
            rates = [
                processing.process_in_process(backend, self.s, workers=workers) for _ in range(self.s.repeats)
            ]
            self.add(backend, f"process.w{workers}", rates, n=self.s.n, workers=workers, processes=1)
        if backend in CROSS_PROCESS:
            rates = [processing.process_two_procs(backend, self.s) for _ in range(self.s.repeats)]
            self.add(backend, "process.2proc.w10", rates, n=self.s.n, workers=10, processes=2)

    def _latency(self, backend: str) -> None:
        kinds: list[tuple[str, Callable[[str, Settings], list[float]]]] = [
            ("same", latency.latency_same_process)
        ]
        if backend in CROSS_PROCESS:
            kinds.append(("cross", latency.latency_cross_process))
        for kind, fn in kinds:
            ms = fn(backend, self.s)
            for q in (50, 99):
                self.add(backend, f"latency.{kind}.p{q}", ms, value=percentile(ms, q), count=len(ms))

    def _claims(self, backend: str) -> None:
        stores = {
            "small_finished": (self.s.small_finished, False),
            "big_finished": (self.s.big_finished, False),
            "pruning": (self.s.pruning_finished, True),
        }
        runs = claims.claim_rates(backend, self.s, list(stores.values()))
        for (name, (count, _)), run in zip(stores.items(), runs, strict=True):
            budget_hit = f" (budget hit; asked {count:,})" if run.reached < count else ""
            pruned = f", {run.pruned:,} pruned meanwhile" if name == "pruning" else ""
            self.add(
                backend,
                f"claims.{name}",
                run.samples,
                n=self.s.n,
                k=claims.CLAIM_K,
                finished=run.reached,
                pruned=run.pruned,
                fill_seconds=round(run.fill_seconds, 1),
                note=f"{run.reached:,} finished{budget_hit}{pruned}",
            )

    def _limits(self, backend: str) -> None:
        variants = list(processing.LIMIT_VARIANTS)
        rates: dict[str, list[float]] = {v: [] for v in variants}
        # Interleaved, so drift in the machine's load hits all alike, and rotated per repeat, so
        # no variant is always the one run first (after the previous group's store is dropped).
        for repeat in range(self.s.repeats):
            shift = repeat % len(variants)
            for variant in variants[shift:] + variants[:shift]:
                rates[variant].append(processing.process_in_process(backend, self.s, variant=variant))
        for variant in variants:
            self.add(backend, f"limits.{variant}", rates[variant], n=self.s.n, workers=10)

    def _rss(self, backend: str) -> None:
        if backend != "memory":
            return
        import subprocess

        out = subprocess.run(
            [sys.executable, "-m", "benchmarks.child", "rss", json.dumps({"tasks": self.s.rss_tasks})],
            check=True,
            capture_output=True,
            text=True,
        ).stdout
        got = json.loads(out)
        held = (got["after"] - got["before"]) / 2**20
        note = f"{self.s.rss_tasks:,} pending; +{held:,.0f} MB, {held * 2**20 / self.s.rss_tasks:,.0f} B/task"
        self.add(backend, "memory.rss", [got["after"] / 2**20], tasks=self.s.rss_tasks, note=note)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the benchmarks; exit status 1 when a group failed."""
    args = parse_args(sys.argv[1:] if argv is None else argv)
    backends = choose(args.backend, BACKENDS, "backend")
    groups = choose(args.only, GROUPS, "group")
    run = Run(settings_from(args), groups)
    run.header(backends)
    started = time.perf_counter()
    for backend in backends:
        run.backend(backend)
    table = render_table(run.figures)
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    footer = f"\n{len(run.figures)} figures in {time.perf_counter() - started:.0f} s; load average now {load}"
    print("\n" + table + footer, flush=True)
    if args.table:
        with open(args.table, "w") as out:
            out.write(table + "\n")
    return 1 if run.errors else 0
