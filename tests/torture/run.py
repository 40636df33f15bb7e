"""The torture run: ``python -m torture.run --profile short|long --backend NAME|all --seed N``.

Per backend: start a private store, three workers (each behind its own proxy) and two
producers, let the nemesis inject the profile's faults while the producers submit, then stop
the faults, let the run settle (workers keep running until every task is final, within the
profile's bound), stop the workers gracefully and check the invariants (`checker`). Prints a
report per backend and exits 1 on any violation (``--expect-violations``: exits 1 unless
there is one -- the harness's own test, with ``--inject-bug``).
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from taskgate import Filter, Task
from taskgate.brokers import open_broker
from taskgate.brokers.base import Broker

from .checker import INVARIANTS, Limits, StoredTask, check
from .cluster import Cluster
from .ledger import Ledger, read_ledgers
from .nemesis import PROFILES, Nemesis, Profile
from .stores import BACKENDS, open_store
from .workload import LEASE_TTL, QUEUES

WORKERS, PRODUCERS = 3, 2
BUGS = ("ignore-lease-loss",)


def limits(undo_window: float = 0.0) -> Limits:
    """The workload's limits as the checker reads them, on a store whose server crash may undo
    the claims of its last ``undo_window`` seconds (`Store.undo_window`)."""
    return Limits(
        workers={name: q.workers for name, q in QUEUES.items() if q.shared_limits},
        group_workers={name: q.group_workers for name, q in QUEUES.items() if q.group_workers},
        quotas={
            name: (q.quota_limit, q.period.total_seconds())
            for name, q in QUEUES.items()
            if q.quota_limit and q.period is not None
        },
        undo_window_ns=round(undo_window * 1e9),
        lease_ttl_ns=round(LEASE_TTL * 1e9),
    )


def stored(task: Task) -> StoredTask:
    """The checker's view of one stored task."""
    return StoredTask(
        id=task.id,
        type=task.type,
        queue=task.queue,
        status=str(task.status),
        claims=task.claims,
        lease_lost=task.lease_lost,
        group=task.group,
        last_error=task.last_error,
        depends_on=task.depends_on,
    )


def _retrying(call: Any, bound: float = 60.0) -> Any:
    deadline = time.monotonic() + bound
    while True:
        try:
            return call()
        except Exception:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)


def settle(broker: Broker, expected: set[str], bound: float) -> tuple[float, list[Task]]:
    """Wait until the store holds every id of ``expected`` and every task is final; the
    seconds it took and the tasks still not final at ``bound`` (none: it settled)."""
    began = time.monotonic()
    waiting: list[Task] = []
    while time.monotonic() - began < bound:
        try:
            tasks = broker.list(Filter())
        except Exception:
            time.sleep(0.5)
            continue
        waiting = [t for t in tasks if not t.status.is_final]
        if expected <= {t.id for t in tasks} and not waiting:
            return time.monotonic() - began, []
        time.sleep(0.5)
    return time.monotonic() - began, waiting


@dataclass
class Final:
    """What a run left: the store's tasks and counts once settled, and every ledger event."""

    tasks: list[StoredTask]
    counts: dict[str, dict[Any, int]]
    events: list[dict[str, Any]]
    settle_seconds: float
    unsettled: list[Task]


def run_backend(backend: str, profile: Profile, seed: int, inject_bug: str, root: Path) -> dict[str, Any]:
    """One backend's run; its report (see `print_report`)."""
    began = time.monotonic()
    ledgers = root / backend / "ledgers"
    ledgers.mkdir(parents=True)
    store = open_store(backend, root / backend / "store")
    driver = Ledger(ledgers / "driver.jsonl", "driver")
    cluster = Cluster(store, ledgers, driver, inject_bug=inject_bug)
    try:
        nemesis = Nemesis(cluster, profile, random.Random(f"{seed}/nemesis/{backend}"), driver)
        _start(cluster, nemesis, profile, seed)
        _faults(cluster, nemesis, profile, began)
        final = _settle(cluster, profile)
        report = _report(final, cluster, nemesis, profile)
        report.update(
            backend=backend, seed=seed, inject_bug=inject_bug or None, directory=str(root / backend)
        )
        report["wall_seconds"] = round(time.monotonic() - began, 1)
        return report
    finally:
        cluster.stop_all()
        store.stop()


def _start(cluster: Cluster, nemesis: Nemesis, profile: Profile, seed: int) -> None:
    """Make the tables, start the workers (one skewed), then the producers."""
    store = cluster.store
    setup = open_broker(store.url(), **store.options)
    _retrying(lambda: setup.list(Filter(limit=1)))  # tables made once, before the crowd
    setup.close()
    skewed = [0.0, 2.5, 0.0] if nemesis.skew else []
    cluster.start_workers(WORKERS, skewed)
    nemesis.done["skew"] += sum(1 for s in skewed if s)
    time.sleep(1.0)  # every worker polls before the first submit
    per_producer = profile.tasks // PRODUCERS
    cluster.start_producers(
        PRODUCERS, seed, per_producer, profile.duration, profile.long_rate, profile.long_hold
    )


def _faults(cluster: Cluster, nemesis: Nemesis, profile: Profile, began: float) -> None:
    """Run the nemesis until the producers are done and its schedule ran; then heal everything."""
    nemesis.start()
    for producer in cluster.producers:
        producer.wait(timeout=profile.duration + 300)
    nemesis.join(timeout=max(0.0, profile.duration * 1.2 - (time.monotonic() - began)))
    nemesis.stop()
    nemesis.join()
    for slot in cluster.slots:
        if slot.proxy is not None:
            slot.proxy.heal()
    cluster.ensure_workers()
    cluster.driver.record("faults_end")


def _settle(cluster: Cluster, profile: Profile) -> Final:
    """Let the workers finish everything (within the bound), stop them, read the store."""
    broker = open_broker(cluster.store.url(), **cluster.store.options)
    try:
        events = read_ledgers(cluster.directory)
        submitted = {e["id"] for e in events if e["e"] in ("submit", "replay")}
        seconds, unsettled = settle(broker, submitted, profile.settle)
        cluster.stop_workers()
        tasks = [stored(t) for t in _retrying(lambda: broker.list(Filter()))]
        counts = _retrying(broker.counts)
    finally:
        broker.close()
    return Final(tasks, counts, read_ledgers(cluster.directory), seconds, unsettled)


def _report(final: Final, cluster: Cluster, nemesis: Nemesis, profile: Profile) -> dict[str, Any]:
    violations = check(final.events, final.tasks, final.counts, limits(cluster.store.undo_window))
    if final.unsettled:  # stuck is what the bound found, not what the shutdown left
        violations.counts["stuck"] = 0
        violations.samples.pop("stuck", None)
        for t in final.unsettled:
            violations.add(
                "stuck", f"{t.id} ({t.queue}) still {t.status} {profile.settle:.0f} s after faults ended"
            )
    producers_ok = all(p.returncode == 0 for p in cluster.producers)
    kinds = [e["e"] for e in final.events]
    recorded = {e["id"] for e in final.events if e["e"] in ("submit", "replay")}
    statuses = sorted({t.status for t in final.tasks})
    return {
        "profile": profile.name,
        "tasks": len(final.tasks),
        "submitted": kinds.count("submit"),
        "replays": kinds.count("replay"),
        "cancels": kinds.count("cancel"),
        "runs": kinds.count("start"),
        "producer_retries": kinds.count("fault_seen"),
        "submits_found_by_key": sum(1 for e in final.events if e["e"] == "submit" and e.get("by_key")),
        # Tasks no producer recorded (a replay whose answer a fault swallowed): not lost, shown.
        "unrecorded": len({t.id for t in final.tasks} - recorded),
        "events": len(final.events),
        "statuses": {s: sum(1 for t in final.tasks if t.status == s) for s in statuses},
        "lease_lost": sum(t.lease_lost for t in final.tasks),
        "claims_undone": violations.undone,
        "faults": dict(sorted(nemesis.done.items())),
        "fault_errors": nemesis.errors,
        "producers_ok": producers_ok,
        "settled": not final.unsettled,
        "settle_seconds": round(final.settle_seconds, 1),
        "peaks": violations.peaks,
        "violations": violations.counts,
        "violation_samples": dict(violations.samples),
        "unexpected_exits": cluster.unexpected_exits,
        # A fault that failed (a server that did not come back, say) leaves the run proving less
        # than its report claims: it fails the run too.
        "total_violations": violations.total
        + (0 if producers_ok else 1)
        + len(cluster.unexpected_exits)
        + len(nemesis.errors),
    }


def print_report(report: dict[str, Any]) -> None:
    """The human report of one backend's run."""
    print(
        f"== torture {report['backend']} ({report['profile']}, seed {report['seed']}"
        f"{', bug ' + report['inject_bug'] if report['inject_bug'] else ''}): "
        f"{report['tasks']} tasks ({report['submitted']} submits, {report['replays']} replays, "
        f"{report['cancels']} cancels), {report['runs']} handler runs, {report['events']} events"
    )
    print(
        f"   final: {report['statuses']}, lease_lost total {report['lease_lost']}, "
        f"claims undone by a server crash: {report['claims_undone']}, "
        f"producer calls retried after a fault: {report['producer_retries']} "
        f"({report['submits_found_by_key']} submits answered by their business key), "
        f"tasks no producer recorded: {report['unrecorded']}"
    )
    print(
        f"   faults: {report['faults']}"
        + (f" (failed: {report['fault_errors']})" if report["fault_errors"] else "")
    )
    print(
        f"   settled: {report['settled']} in {report['settle_seconds']} s; "
        f"run took {report['wall_seconds']} s; producers ok: {report['producers_ok']}"
    )
    if report["unexpected_exits"]:
        print(f"   workers that ended on their own: {report['unexpected_exits']}")
    print("   limits at their peak: " + ", ".join(f"{k}={v}" for k, v in sorted(report["peaks"].items())))
    print("   violations: " + ", ".join(f"{k}={report['violations'][k]}" for k in INVARIANTS))
    for invariant, samples in report["violation_samples"].items():
        for sample in samples:
            print(f"     {invariant}: {sample}")


def main(argv: list[str] | None = None) -> int:
    """Run the chosen profile on the chosen backends; 0 when no invariant was violated."""
    parser = argparse.ArgumentParser(prog="torture", description=__doc__)
    parser.add_argument("--profile", choices=["short", "long"], default="short")
    parser.add_argument("--backend", choices=[*BACKENDS, "all"], default="all")
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--inject-bug", choices=BUGS, default="")
    parser.add_argument("--expect-violations", action="store_true")
    parser.add_argument("--keep", action="store_true", help="keep the ledgers and logs of the run")
    parser.add_argument("--json", type=Path, default=None, help="also write the reports to this file")
    args = parser.parse_args(argv)
    seed = args.seed if args.seed is not None else random.randrange(1_000_000)
    # The injected bug shows only where a partition outlasts the lease while a long run holds it.
    profile = PROFILES["bug" if args.inject_bug else args.profile]
    backends = BACKENDS if args.backend == "all" else (args.backend,)
    root = Path(tempfile.mkdtemp(prefix="taskgate-torture-"))
    print(f"torture: profile {profile.name}, seed {seed}, backends {', '.join(backends)}, files in {root}")
    began = time.monotonic()
    reports = []
    for backend in backends:
        report = run_backend(backend, profile, seed, args.inject_bug, root)
        print_report(report)
        reports.append(report)
    total = sum(r["total_violations"] for r in reports)
    print(f"torture: {total} violations in {time.monotonic() - began:.0f} s (seed {seed})")
    if args.json is not None:
        args.json.write_text(json.dumps(reports, indent=2))
    failed = total == 0 if args.expect_violations else total > 0
    if not failed and not args.keep:
        shutil.rmtree(root, ignore_errors=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
