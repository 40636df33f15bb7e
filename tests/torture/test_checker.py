"""The torture checker catches each kind of violation in a synthetic history and passes a clean one.

Histories are written by hand (ledger events as the processes write them, the final store's
tasks, ``counts()``), so each case breaks exactly one invariant of a clean run.
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from collections.abc import Callable
from typing import Any

import pytest

from .checker import INVARIANTS, Limits, StoredTask, check, runs_from

LIMITS = Limits(workers={"shared": 2, "free": 4}, group_workers={"shared": 1}, quotas={"quota": (2, 1.0)})
MS = 1_000_000  # mono stamps are nanoseconds


class History:
    """A clean history of seven tasks; the cases below each break it one way."""

    def __init__(self) -> None:
        self.events: list[dict[str, Any]] = []
        self.tasks: dict[str, StoredTask] = {}
        for task_id, queue, group in [
            ("a", "free", None),
            ("b", "free", None),
            ("c", "free", None),
            ("d", "shared", "g1"),
            ("e", "shared", "g2"),
            ("q1", "quota", None),
            ("q2", "quota", None),
        ]:
            self.submit(task_id, queue, group)
        self.tasks["c"] = dataclasses.replace(self.tasks["c"], depends_on=("a", "b"))
        self.run("a", "w0.1", 1, 10, 20)
        self.run("b", "w1.1", 1, 12, 25)
        self.run("c", "w0.1", 1, 30, 40)  # after both parents ended ok
        # d: its first run is cut by a SIGKILL of w1.1; w0.1 runs it again once the lease expired
        self.start("d", "w1.1", 1, 50)
        self.event("kill", "driver", 60, target="w1.1")
        self.run("d", "w0.1", 2, 70, 80)
        self.run("e", "w2.1", 1, 71, 79, out="error")
        self.run("e", "w2.1", 2, 90, 95)
        self.run("q1", "w2.1", 1, 100, 110, started_at=1000.1)
        self.run("q2", "w0.1", 1, 100, 110, started_at=1000.2)
        for task_id in self.tasks:
            claims = max(e["claim"] for e in self.events if e["e"] == "start" and e["id"] == task_id)
            self.set(task_id, status="completed", claims=claims)
        self.set("d", lease_lost=1)

    def event(self, kind: str, proc: str, at_ms: int, **fields: Any) -> None:
        self.events.append({"e": kind, "proc": proc, "pid": 1, "mono": at_ms * MS, "wall": 0.0, **fields})

    def submit(self, task_id: str, queue: str, group: str | None) -> None:
        self.tasks[task_id] = StoredTask(task_id, type=queue, queue=queue, status="pending", group=group)
        self.event("submit", "p0", 0, id=task_id, q=queue, g=group)

    def start(self, task_id: str, proc: str, claim: int, at: int, started_at: float | None = None) -> None:
        task = self.tasks[task_id]
        self.event(
            "start", proc, at, id=task_id, q=task.queue, g=task.group, claim=claim, started_at=started_at
        )

    def run(
        self,
        task_id: str,
        proc: str,
        claim: int,
        start: int,
        end: int,
        out: str = "ok",
        started_at: float | None = None,
    ) -> None:
        self.start(task_id, proc, claim, start, started_at)
        task = self.tasks[task_id]
        self.event("end", proc, end, id=task_id, q=task.queue, g=task.group, claim=claim, out=out)

    def set(self, task_id: str, **fields: Any) -> None:
        self.tasks[task_id] = dataclasses.replace(self.tasks[task_id], **fields)

    def counts(self) -> dict[str, dict[str, int]]:
        counts: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
        for t in self.tasks.values():
            counts[t.type][t.status] += 1
        return counts

    def check(self, counts: dict[str, dict[str, int]] | None = None) -> dict[str, int]:
        events = sorted(self.events, key=lambda e: e["mono"])
        return check(events, list(self.tasks.values()), counts or self.counts(), LIMITS).counts


def test_a_clean_history_passes() -> None:
    history = History()
    assert len(runs_from(history.events)) == 9
    assert history.check() == dict.fromkeys(INVARIANTS, 0)


def test_a_killed_run_ends_at_the_kill() -> None:
    runs = {(r.task_id, r.claim): r for r in runs_from(History().events)}
    assert (runs[("d", 1)].end, runs[("d", 1)].outcome) == (60 * MS, "killed")


def _lost(h: History) -> None:
    del h.tasks["b"]
    h.tasks["c"] = dataclasses.replace(h.tasks["c"], depends_on=("a",))
    h.events = [e for e in h.events if e.get("id") != "b" or e["e"] == "submit"]


def _stuck(h: History) -> None:
    h.set("e", status="running")


def _completed_twice(h: History) -> None:
    h.run("a", "w2.1", 2, 200, 210)
    h.set("a", claims=2)  # a second claim, but no lease was lost


def _completed_unrun(h: History) -> None:
    h.events = [{**e, "out": "error"} if e.get("id") == "e" and e["e"] == "end" else e for e in h.events]


def _start_without_claim(h: History) -> None:
    h.set("e", claims=1)  # the ledger shows claim 2


def _one_holder(h: History) -> None:
    h.events = [e for e in h.events if not (e.get("id") == "a" and e["e"] in ("start", "end"))]
    h.start("a", "w3.1", 1, 5)
    h.event("kill", "driver", 15, target="w3.1")  # the first run outlived the second's start
    h.run("a", "w0.1", 2, 12, 20)
    h.set("a", claims=2, lease_lost=1)


def _workers(h: History) -> None:
    h.set("d", group="g3")  # d overlaps e; a third shared run at that moment breaks workers=2
    h.submit("f", "shared", None)
    h.run("f", "w2.1", 1, 72, 74)
    h.set("f", status="completed", claims=1)


def _group_workers(h: History) -> None:
    h.set("e", group="g1")
    h.events = [{**e, "g": "g1"} if e.get("id") == "e" else e for e in h.events]


def _quota(h: History) -> None:
    h.submit("q3", "quota", None)
    h.run("q3", "w1.2", 1, 105, 106, started_at=1000.9)  # a third start in window [1000, 1001)
    h.set("q3", status="completed", claims=1)


def _child_before_parent(h: History) -> None:
    h.events = [e for e in h.events if not (e.get("id") == "b" and e["e"] in ("start", "end"))]
    h.run("b", "w1.1", 1, 12, 35)  # c started at 30


def _child_of_failed_parent(h: History) -> None:
    h.set("a", status="failed", last_error="RuntimeError: boom")


def _failed_without_error(h: History) -> None:
    h.set("e", status="failed")


CASES: dict[str, tuple[Callable[[History], None], str]] = {
    "lost": (_lost, "lost"),
    "stuck": (_stuck, "stuck"),
    "completed_twice": (_completed_twice, "completed_twice"),
    "completed_unrun": (_completed_unrun, "completed_unrun"),
    "start_without_claim": (_start_without_claim, "start_without_claim"),
    "one_holder": (_one_holder, "one_holder"),
    "workers": (_workers, "workers"),
    "group_workers": (_group_workers, "group_workers"),
    "quota": (_quota, "quota"),
    "child_before_parent": (_child_before_parent, "child_before_parent"),
    "child_of_failed_parent": (_child_of_failed_parent, "child_before_parent"),
    "failed_without_error": (_failed_without_error, "failed_without_error"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_each_violation_is_caught_and_only_it(case: str) -> None:
    breaks, invariant = CASES[case]
    history = History()
    breaks(history)
    found = history.check()
    assert found[invariant] >= 1
    assert {k: n for k, n in found.items() if n and k != invariant} == {}


def test_counts_that_disagree_with_the_list_are_caught() -> None:
    history = History()
    counts = history.counts()
    counts["free"]["completed"] -= 1
    counts["free"]["running"] = 1
    found = history.check(counts)
    assert found["counts"] == 2
    assert sum(found.values()) == 2


def test_a_tolerance_forgives_overlaps_within_it() -> None:
    history = History()
    _one_holder(history)
    events = sorted(history.events, key=lambda e: e["mono"])
    tasks, counts = list(history.tasks.values()), history.counts()
    assert check(events, tasks, counts, LIMITS).counts["one_holder"] == 1
    assert (
        check(events, tasks, counts, dataclasses.replace(LIMITS, tolerance_ns=5 * MS)).counts["one_holder"]
        == 0
    )


UNDOING = dataclasses.replace(LIMITS, undo_window_ns=20 * MS, lease_ttl_ns=30 * MS)


def _claim_undone_by_a_crash(history: History, *, restart: bool = True, first_end: int = 135) -> None:
    """Task ``u`` on the shared queue (``workers=2``): claim 1 starts 5 ms before the server
    crashes (a restart from 125 to 130 ms), the store forgets that claim, and after the restart
    another worker claims ``u`` again -- as claim 1 once more. The first run ends ok at
    ``first_end`` (its ack refused: the lease is gone). Task ``s`` runs on the same queue
    throughout: with both runs of ``u`` it would be 3 at once, unless the first run's slot went
    with the crash."""
    if restart:
        for event, at in (("fault", 125), ("fault_end", 130)):
            history.events.append({"e": event, "proc": "driver", "mono": at * MS, "kind": "restart"})
    for task_id, group in (("u", "g3"), ("s", "g4")):
        history.submit(task_id, "shared", group)
        history.set(task_id, status="completed", claims=1)
    history.run("s", "w2.1", 1, 119, 160)
    history.run("u", "w1.2", 1, 120, first_end)
    history.run("u", "w0.1", 1, 131, 150)


def _check(history: History, limits: Limits) -> set[str]:
    events = sorted(history.events, key=lambda e: e["mono"])
    found = check(events, list(history.tasks.values()), history.counts(), limits).counts
    return {k for k, n in found.items() if n}


def test_a_claim_a_server_crash_undid_explains_its_repeat_its_overlap_and_its_slot() -> None:
    history = History()
    _claim_undone_by_a_crash(history)
    assert _check(history, UNDOING) == set()
    events = sorted(history.events, key=lambda e: e["mono"])
    assert check(events, list(history.tasks.values()), history.counts(), UNDOING).undone == 1


def test_a_repeated_claim_without_a_restart_is_caught() -> None:
    history = History()
    _claim_undone_by_a_crash(history, restart=False)
    assert _check(history, UNDOING) == {"completed_twice", "one_holder", "workers", "group_workers"}


def test_a_store_that_loses_no_claim_is_allowed_no_repeat() -> None:
    history = History()
    _claim_undone_by_a_crash(history)
    assert _check(history, LIMITS) == {"completed_twice", "one_holder", "workers", "group_workers"}


def test_an_undone_run_that_outlives_its_lease_after_the_restart_is_caught() -> None:
    history = History()
    _claim_undone_by_a_crash(history, first_end=161)  # the server was back at 130; lease 30 ms
    assert _check(history, UNDOING) == {"completed_twice", "one_holder", "workers", "group_workers"}
