"""The invariants a run must keep, proved from the ledgers and the final store.

`check` takes plain data -- ledger events (`ledger.read_ledgers`), the store's tasks after the
run (`StoredTask`), ``broker.counts()`` and the workload's `Limits` -- and returns every
violation by invariant. The invariants:

- ``lost``: every acknowledged submit and replay names a task the store holds;
- ``stuck``: once faults stop and the run settles, every task is final (nothing left running,
  pending-while-due, retrying or blocked);
- ``completed_twice``: a task's handler ends ``ok`` more than once only when lease losses
  explain it (``ok`` ends - 1 <= the task's ``lease_lost``, each from a different claim);
- ``completed_unrun``: a completed task has a handler run that ended ``ok`` (its end is recorded
  before the runtime reports the result, so no completion can come without one);
- ``start_without_claim``: a handler's start carries a claim number in 1 .. the task's final
  ``claims``;
- ``one_holder``: two runs of one task never overlap in time;
- ``workers`` / ``group_workers``: runs overlapping in time never exceed a queue's shared
  ``workers``, or ``group_workers`` within one group, across all processes;
- ``quota``: handler starts per quota window (the store's ``started_at`` of each run, on the
  store's clock, windows aligned to the epoch) never exceed the limit;
- ``child_before_parent``: a child's first start comes after each parent's first ``ok`` end,
  and only when every parent completed;
- ``counts``: ``broker.counts()`` equals a recount of the listed tasks;
- ``failed_without_error``: every failed task carries ``last_error``.

A server crash may undo the last claims a store committed without waiting for its disk
(PostgreSQL's plain claims: `Limits.undo_window_ns`). Their tasks are pending again with the
claim count as before, so the re-run repeats the undone run's claim number -- the proof the
store forgot it. Such a run is undone when a restart began at most ``undo_window_ns`` after it
started (and before the server was back), the repeat started after the restart began, and the
run ended within `Limits.lease_ttl_ns` of the server's return (its next heartbeat finds the
lease gone; one that runs on longer is not forgiven). An undone run's ``ok`` end does not
count as a completion, it may overlap its re-run, and the limits count it only until the server
is back (its slot went with the crash): the documented at-least-once of a server crash.

Tolerances: every process stamps events with the same host clock (the raw CLOCK_MONOTONIC,
unaffected by the workers' clock skew), so ordering across processes needs none: a run's
start is recorded after its claim and its end before its slot goes back, so each recorded
run lies inside the time its slot and lease were held, and causal order (parent's end, then
its completion, then the child's claim) shows in the stamps. A run cut by SIGKILL ends at
the kill (stamped by the driver after the process died: later than the true end, so the
check only gets stricter). The quota check uses the store's own ``started_at`` -- the clock the
quota windows turn on -- so it needs no tolerance either. `Limits.tolerance_ns` exists for
stores on other hosts; the torture run uses 0.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "FINAL",
    "INVARIANTS",
    "Limits",
    "Run",
    "StoredTask",
    "check",
    "restarts",
    "runs_from",
    "undone_runs",
]

FINAL = frozenset({"completed", "failed", "canceled"})
INVARIANTS = (
    "lost",
    "stuck",
    "completed_twice",
    "completed_unrun",
    "start_without_claim",
    "one_holder",
    "workers",
    "group_workers",
    "quota",
    "child_before_parent",
    "counts",
    "failed_without_error",
)
_SAMPLES = 5  # messages kept per invariant; the count is always complete


@dataclass(frozen=True)
class StoredTask:
    """What the checker reads of one task in the final store."""

    id: str
    type: str
    queue: str
    status: str
    claims: int = 0
    lease_lost: int = 0
    group: str | None = None
    last_error: str | None = None
    depends_on: tuple[str, ...] = ()


@dataclass(frozen=True)
class Limits:
    """The workload's limits: shared ``workers`` and ``group_workers`` per queue, and quotas
    as ``queue -> (limit, period seconds)``."""

    workers: Mapping[str, int] = field(default_factory=dict)
    group_workers: Mapping[str, int] = field(default_factory=dict)
    quotas: Mapping[str, tuple[int, float]] = field(default_factory=dict)
    tolerance_ns: int = 0
    # How long before a server crash a claim may still be undone by it (0: the store loses no
    # commit it answered), and the lease an undone run's worker must notice the loss within.
    undo_window_ns: int = 0
    lease_ttl_ns: int = 0


@dataclass(frozen=True)
class Run:
    """One handler run from the ledgers: ``end`` is the kill time for a killed process."""

    task_id: str
    proc: str
    claim: int
    queue: str
    group: str | None
    start: int
    end: int
    outcome: str  # ok, error, throttled, cancelled, killed
    started_at: float | None = None


@dataclass
class Violations:
    """Violations by invariant: a complete count and the first few messages of each."""

    counts: dict[str, int] = field(default_factory=lambda: dict.fromkeys(INVARIANTS, 0))
    samples: dict[str, list[str]] = field(default_factory=lambda: defaultdict(list))
    # What the limits' checks saw at their highest (non-vacuity: a limit never reached proves
    # little): "workers:<queue>", "group_workers:<queue>" and "quota:<queue>" -> the peak.
    peaks: dict[str, int] = field(default_factory=dict)
    # Runs whose claim a server crash undid (`undone_runs`): forgiven, and reported.
    undone: int = 0

    def add(self, invariant: str, message: str) -> None:
        self.counts[invariant] += 1
        if len(self.samples[invariant]) < _SAMPLES:
            self.samples[invariant].append(message)

    @property
    def total(self) -> int:
        return sum(self.counts.values())


def runs_from(events: Iterable[Mapping[str, Any]]) -> list[Run]:
    """Pair each ``start`` with its ``end`` (same process, task and claim); a start without an
    end ends at its process's kill, or else at the process's last event."""
    killed: dict[str, int] = {}
    last: dict[str, int] = {}
    open_: dict[tuple[str, str, int], Mapping[str, Any]] = {}
    runs = []
    for e in events:
        if e["e"] == "kill":
            killed[e["target"]] = e["mono"]
            continue
        last[e["proc"]] = max(last.get(e["proc"], 0), e["mono"])
        if e["e"] == "start":
            open_[(e["proc"], e["id"], e["claim"])] = e
        elif e["e"] == "end":
            start = open_.pop((e["proc"], e["id"], e["claim"]), None)
            if start is not None:
                runs.append(_run(start, e["mono"], e["out"]))
    for (proc, _, _), start in open_.items():
        end = killed.get(proc)
        runs.append(_run(start, end if end is not None else last[proc], "killed" if end else "unended"))
    return runs


def _run(start: Mapping[str, Any], end: int, outcome: str) -> Run:
    return Run(
        task_id=start["id"],
        proc=start["proc"],
        claim=start["claim"],
        queue=start["q"],
        group=start.get("g"),
        start=start["mono"],
        end=end,
        outcome=outcome,
        started_at=start.get("started_at"),
    )


def check(
    events: Sequence[Mapping[str, Any]],
    tasks: list[StoredTask],
    counts: Mapping[str, Mapping[str, int]],
    limits: Limits,
) -> Violations:
    """Every violation of the invariants (see the module doc) in one run's history."""
    found = Violations()
    by_id = {t.id: t for t in tasks}
    runs = runs_from(events)
    undone = undone_runs(runs, restarts(events), limits)
    found.undone = len(undone)
    _lost_and_stuck(events, tasks, by_id, found)
    _runs_per_task(runs, by_id, found, limits.tolerance_ns, undone)
    _concurrency([_until_back(r, undone) for r in runs], limits, found)
    _quota(runs, limits, found)
    _parents(runs, by_id, found, limits.tolerance_ns)
    _counts(tasks, counts, found)
    for t in tasks:
        if t.status == "failed" and not t.last_error:
            found.add("failed_without_error", f"{t.id} failed with no last_error")
    return found


def restarts(events: Iterable[Mapping[str, Any]]) -> list[tuple[int, int]]:
    """The server restarts of a run as (crash began, server back) mono stamps, from the
    driver's ``fault`` / ``fault_end`` events of kind ``restart``."""
    began: list[int] = []
    spans = []
    for e in events:
        if e.get("kind") != "restart":
            continue
        if e["e"] == "fault":
            began.append(e["mono"])
        elif e["e"] == "fault_end" and began:
            spans.append((began.pop(0), e["mono"]))
    return spans


def undone_runs(runs: list[Run], spans: Sequence[tuple[int, int]], limits: Limits) -> dict[Run, int]:
    """The runs whose claim a server crash undid (see the module doc), each with the stamp of
    the server's return."""
    if not limits.undo_window_ns:
        return {}
    by_claim: dict[tuple[str, int], list[Run]] = defaultdict(list)
    for run in runs:
        by_claim[(run.task_id, run.claim)].append(run)
    undone: dict[Run, int] = {}
    for same in by_claim.values():
        same.sort(key=lambda r: r.start)
        for earlier, later in itertools.pairwise(same):
            for began, back in spans:
                if (
                    began - limits.undo_window_ns <= earlier.start <= back
                    and later.start >= began
                    and earlier.end <= back + limits.lease_ttl_ns
                ):
                    undone[earlier] = back
                    break
    return undone


def _until_back(run: Run, undone: Mapping[Run, int]) -> Run:
    """``run`` as the store's limits count it: an undone run only until the server is back."""
    back = undone.get(run)
    return run if back is None else dataclasses.replace(run, end=min(run.end, back))


def _lost_and_stuck(
    events: Sequence[Mapping[str, Any]],
    tasks: list[StoredTask],
    by_id: Mapping[str, StoredTask],
    found: Violations,
) -> None:
    for e in events:
        if e["e"] in ("submit", "replay") and e["id"] not in by_id:
            found.add("lost", f"{e['e']} of {e['id']} by {e['proc']} acknowledged, task not in the store")
    for t in tasks:
        if t.status not in FINAL:
            found.add("stuck", f"{t.id} ({t.queue}) still {t.status} after settling")


def _runs_per_task(
    runs: list[Run],
    by_id: Mapping[str, StoredTask],
    found: Violations,
    tolerance: int,
    undone: Mapping[Run, int],
) -> None:
    per_task: dict[str, list[Run]] = defaultdict(list)
    for run in runs:
        per_task[run.task_id].append(run)
    for stored in by_id.values():
        if stored.status == "completed" and not any(r.outcome == "ok" for r in per_task.get(stored.id, ())):
            found.add("completed_unrun", f"{stored.id} is completed but no handler run of it ended ok")
    for task_id, task_runs in per_task.items():
        task = by_id.get(task_id)
        for run in task_runs:
            if task is None or not 1 <= run.claim <= task.claims:
                final = "no such task" if task is None else f"final claims {task.claims}"
                found.add(
                    "start_without_claim", f"{task_id} started by {run.proc} as claim {run.claim} ({final})"
                )
        ok = [r for r in task_runs if r.outcome == "ok" and r not in undone]
        lease_lost = task.lease_lost if task is not None else 0
        if len(ok) > 1 and (len(ok) - 1 > lease_lost or len({r.claim for r in ok}) < len(ok)):
            claims = sorted(r.claim for r in ok)
            found.add(
                "completed_twice",
                f"{task_id} ended ok {len(ok)} times (claims {claims}) with lease_lost={lease_lost}",
            )
        task_runs.sort(key=lambda r: r.start)
        for earlier, later in itertools.pairwise(task_runs):
            if later.start + tolerance < earlier.end and earlier not in undone:
                found.add(
                    "one_holder",
                    f"{task_id}: claim {later.claim} in {later.proc} started "
                    f"{(earlier.end - later.start) / 1e6:.0f} ms before claim {earlier.claim} "
                    f"in {earlier.proc} ended ({earlier.outcome})",
                )


def _sweep(runs: list[Run], limit: int, tolerance: int) -> tuple[int, int, list[Run]]:
    """The highest number of runs overlapping, when, and which runs then."""
    points = []
    for run in runs:
        points.append((run.start + tolerance, 1, run))
        points.append((run.end, -1, run))
    points.sort(key=lambda p: (p[0], p[1]))  # ends before starts at the same instant
    running: set[Run] = set()
    peak, when, at_peak = 0, 0, []
    for at, step, run in points:
        if step == 1:
            running.add(run)
        else:
            running.discard(run)
        if len(running) > peak:
            peak, when, at_peak = len(running), at, list(running)
    return peak, when, at_peak


def _concurrency(runs: list[Run], limits: Limits, found: Violations) -> None:
    for queue, limit in limits.workers.items():
        queue_runs = [r for r in runs if r.queue == queue]
        peak, when, at_peak = _sweep(queue_runs, limit, limits.tolerance_ns)
        found.peaks[f"workers:{queue}"] = peak
        if peak > limit:
            who = ", ".join(f"{r.task_id}@{r.proc}#{r.claim}({r.outcome})" for r in at_peak)
            found.add(
                "workers", f"queue {queue}: {peak} runs at once (workers={limit}) at mono {when}: {who}"
            )
    for queue, limit in limits.group_workers.items():
        if not limit:
            continue
        groups: dict[str, list[Run]] = defaultdict(list)
        for r in runs:
            if r.queue == queue and r.group is not None:
                groups[r.group].append(r)
        for group, group_runs in sorted(groups.items()):
            peak, when, at_peak = _sweep(group_runs, limit, limits.tolerance_ns)
            key = f"group_workers:{queue}"
            found.peaks[key] = max(found.peaks.get(key, 0), peak)
            if peak > limit:
                who = ", ".join(f"{r.task_id}@{r.proc}#{r.claim}({r.outcome})" for r in at_peak)
                found.add(
                    "group_workers",
                    f"queue {queue} group {group}: {peak} runs at once (group_workers={limit}) "
                    f"at mono {when}: {who}",
                )


def _quota(runs: list[Run], limits: Limits, found: Violations) -> None:
    for queue, (limit, period) in limits.quotas.items():
        windows: dict[int, set[tuple[str, int]]] = defaultdict(set)
        for r in runs:
            if r.queue == queue and r.started_at is not None:
                windows[math.floor(r.started_at / period)].add((r.task_id, r.claim))
        found.peaks[f"quota:{queue}"] = max((len(s) for s in windows.values()), default=0)
        found.peaks[f"quota_full_windows:{queue}"] = sum(1 for s in windows.values() if len(s) >= limit)
        for window, starts in sorted(windows.items()):
            if len(starts) > limit:
                found.add(
                    "quota",
                    f"queue {queue}: {len(starts)} starts in the window at {window * period:.0f} "
                    f"(limit {limit})",
                )


def _parents(runs: list[Run], by_id: Mapping[str, StoredTask], found: Violations, tolerance: int) -> None:
    first_ok: dict[str, int] = {}
    first_start: dict[str, Run] = {}
    for r in sorted(runs, key=lambda r: r.start):
        if r.outcome == "ok":
            first_ok.setdefault(r.task_id, r.end)
        first_start.setdefault(r.task_id, r)
    for task in by_id.values():
        child = first_start.get(task.id)
        if child is None or not task.depends_on:
            continue
        for parent in task.depends_on:
            stored = by_id.get(parent)
            ended = first_ok.get(parent)
            if stored is None or stored.status != "completed":
                state = "missing" if stored is None else stored.status
                found.add("child_before_parent", f"{task.id} ran though its parent {parent} is {state}")
            elif ended is None:
                found.add("child_before_parent", f"{task.id} ran though its parent {parent} never ended ok")
            elif child.start + tolerance < ended:
                found.add(
                    "child_before_parent",
                    f"{task.id} started {(ended - child.start) / 1e6:.0f} ms before its parent {parent} "
                    "ended ok",
                )


def _counts(tasks: list[StoredTask], counts: Mapping[str, Mapping[str, int]], found: Violations) -> None:
    recount: dict[tuple[str, str], int] = defaultdict(int)
    for t in tasks:
        recount[(t.type, t.status)] += 1
    reported = {(type_, str(status)): n for type_, per in counts.items() for status, n in per.items() if n}
    for key in sorted(set(recount) | set(reported)):
        if recount.get(key, 0) != reported.get(key, 0):
            found.add(
                "counts",
                f"type {key[0]} status {key[1]}: counts() says {reported.get(key, 0)}, "
                f"list has {recount.get(key, 0)}",
            )
