"""The memory broker's shared limits: each queue's slots, start rate, turns and group limits.

A memory broker's users -- every `Gate` and scheduler built on one `MemoryBroker` -- share its
process, so its limits are shared by construction, once claims carry them (`Claim.shared`):
the same rules as the SQL broker's (`taskgate.brokers.sql.slots`, `taskgate.brokers.sql.groups`)
and the Redis broker's (``claim_limited.lua``), kept in dicts under the broker's lock.

- Slots: one per lease, under its token, until the lease's end (renewed by a heartbeat with
  ``slot_queue``, given back by `GiveBack.slots` or `SharedLimits.release`); an expired slot
  stops counting at once, so a crashed or stalled holder's slot comes back with its lease.
  A slot remembers its task's group: a group's slots are the queue's slots of its tasks.
- Rate: one arrival time per queue (`taskgate.brokers.gcra.Gcra`), moved on only by the starts
  a claim made.
- Turns: a claimer that found no free slot while tasks were due is owed one (noted once, until
  ``now + lease_ttl``); every other claimer leaves a free slot per waiter, a waiter one per
  waiter noted before it.
- Groups: each group's room -- ``group_workers`` less its slots, its own rate's starts, what is
  left of its quota window -- is worked out the first time a claim meets one of its tasks, and
  a task of a group without room is passed over, never holding up another group's.
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import datetime, timedelta

from taskgate.brokers.base import Lease
from taskgate.brokers.gcra import Gcra
from taskgate.brokers.memory._quota import window_bounds
from taskgate.brokers.memory._record import Record
from taskgate.brokers.params import Claim, Claimed, SharedLimits

__all__ = ["Admit", "SharedBook", "Take"]

# Whether a walk in claim order may lease this record (and count it against its group's room).
Admit = Callable[[Record], bool]
# Lease up to n due tasks (those ``admit`` lets through; None: the oldest due), spending the
# claim's quota units for them: the `Claimed` of the leases.
Take = Callable[[int, Admit | None], Claimed]

# Group rows kept before the stale ones are looked for (then twice the live count).
_PRUNE_AT = 64


@dataclass(slots=True)
class _Slot:
    expires_at: datetime
    group: str | None


class _QueueLimits:
    """What one queue's claims share."""

    __slots__ = ("group_tat", "group_windows", "prune_at", "rate_tat", "slots", "waiters")

    def __init__(self) -> None:
        self.slots: dict[str, _Slot] = {}
        self.waiters: dict[str, datetime] = {}  # claimer -> noted until
        self.rate_tat: datetime | None = None
        self.group_tat: dict[str, datetime] = {}
        self.group_windows: dict[str, tuple[datetime, int]] = {}  # group -> (window start, used)
        self.prune_at = _PRUNE_AT

    def live_slots(self, now: datetime) -> int:
        """The slots held at ``now``, after dropping the expired ones."""
        expired = [token for token, slot in self.slots.items() if slot.expires_at <= now]
        for token in expired:
            del self.slots[token]
        return len(self.slots)

    def forget_stale_groups(self, now: datetime, quota_period: timedelta | None) -> None:
        """Drop group rates already caught up with now and quota windows already over, once
        there are many: a queue with many short-lived tenants must not grow without bound."""
        if len(self.group_tat) + len(self.group_windows) < self.prune_at:
            return
        self.group_tat = {g: tat for g, tat in self.group_tat.items() if tat > now}
        if quota_period is None:
            self.group_windows = {}
        else:
            current = window_bounds(now, quota_period)[0]
            self.group_windows = {g: w for g, w in self.group_windows.items() if w[0] >= current}
        self.prune_at = max(_PRUNE_AT, 2 * (len(self.group_tat) + len(self.group_windows)))


class SharedBook:
    """The shared limits of every queue of one memory broker (call under its lock)."""

    __slots__ = ("_queues",)

    def __init__(self) -> None:
        self._queues: defaultdict[str, _QueueLimits] = defaultdict(_QueueLimits)

    def release(self, queue: str, tokens: tuple[str, ...]) -> None:
        """Give back the slots of ``tokens`` (a token not held is ignored)."""
        slots = self._queues[queue].slots
        for token in tokens:
            slots.pop(token, None)

    def renew(self, queue: str, token: str, until: datetime, now: datetime) -> bool:
        """Extend the slot of ``token`` to ``until``; False when it is no longer held (given
        back, or expired -- then it is dropped)."""
        slots = self._queues[queue].slots
        slot = slots.get(token)
        if slot is None:
            return False
        if slot.expires_at <= now:
            del slots[token]
            return False
        slot.expires_at = until
        return True

    def claim(
        self, claim: Claim, now: datetime, take: Take, any_due: Callable[[], bool]
    ) -> tuple[Claimed, bool]:
        """``claim`` within its `SharedLimits` (its ``release`` already given back): what
        ``take`` leased, with ``retry_after`` when the rate held due tasks back; and whether
        waiters should be woken (slots given back were left to them while tasks are due)."""
        shared = claim.shared
        assert shared is not None, "SharedBook.claim needs Claim.shared"
        limits = self._queues[claim.queue]
        unused = shared.workers - limits.live_slots(now)
        turns = _Turns(limits.waiters, shared.claimer, now)
        free = unused - turns.owed
        wanted = min(claim.limit, free)
        rate = Gcra(shared.rps, shared.burst, limits.rate_tat, now) if shared.rps > 0 else None
        allowed = wanted if rate is None else min(wanted, rate.room())
        rooms = _GroupRooms(limits, shared, now) if shared.grouped else None
        claimed = take(allowed, None if rooms is None else rooms.admit) if allowed > 0 else Claimed([])
        leases = claimed.leases
        for lease in leases:
            limits.slots[lease.token] = _Slot(lease.expires_at, lease.task.group)
        if rooms is not None:
            rooms.spend(leases)
        due = _Once(any_due)
        retry_after = 0.0
        if rate is not None:
            rate.spend(len(leases))
            limits.rate_tat = rate.tat
            if len(leases) == allowed < wanted and due():
                retry_after = rate.wait()
        wake = False
        if turns.active:
            turns.settle(len(leases), lambda: free <= 0 and due(), now + claim.lease_ttl)
            wake = bool(shared.release) and turns.owed > 0 and unused - len(leases) > 0 and due()
        if retry_after:
            claimed = replace(claimed, retry_after=retry_after)
        return claimed, wake


class _Turns:
    """The claimers owed a turn at a free slot, as one claim sees and leaves them."""

    __slots__ = ("_claimer", "_waiters", "_waiting", "active", "owed")

    def __init__(self, waiters: dict[str, datetime], claimer: str, now: datetime) -> None:
        self.active = bool(claimer)
        self._claimer = claimer
        for gone in [c for c, until in waiters.items() if until <= now]:
            del waiters[gone]
        self._waiters = waiters
        self._waiting = self.active and claimer in waiters
        if not self.active:
            self.owed = 0
        elif self._waiting:
            # Same ttl for all: noted earlier is due to expire earlier.
            mine = waiters[claimer]
            self.owed = sum(1 for until in waiters.values() if until < mine)
        else:
            self.owed = len(waiters)

    def settle(self, taken: int, found_no_slot: Callable[[], bool], until: datetime) -> None:
        """Strike this claimer off once it got a slot; note it as owed one (until ``until``)
        when it found none while tasks were due -- once: a waiter keeps its place in line."""
        if taken > 0:
            if self._waiting:
                del self._waiters[self._claimer]
        elif not self._waiting and found_no_slot():
            self._waiters[self._claimer] = until


class _GroupRooms:
    """Each group's room for one claim (worked out when the walk first meets the group), and
    what the claim's leases spent of it."""

    __slots__ = ("_held", "_limits", "_now", "_room", "_shared", "_window")

    def __init__(self, limits: _QueueLimits, shared: SharedLimits, now: datetime) -> None:
        self._limits, self._shared, self._now = limits, shared, now
        period = shared.group_quota_period
        limits.forget_stale_groups(now, period)
        self._window = window_bounds(now, period)[0] if period is not None else None
        self._held: Counter[str] = Counter()
        if shared.group_workers:
            self._held.update(slot.group for slot in limits.slots.values() if slot.group is not None)
        self._room: dict[str, float] = {}

    def admit(self, record: Record) -> bool:
        """Whether ``record``'s group has room left (then one is counted as taken)."""
        group = record.group
        if group is None:
            return True
        room = self._room.get(group)
        if room is None:
            room = self._room_of(group)
        if room <= 0:
            self._room[group] = room
            return False
        self._room[group] = room - 1
        return True

    def _room_of(self, group: str) -> float:
        shared = self._shared
        room = math.inf
        if shared.group_workers:
            room = min(room, shared.group_workers - self._held[group])
        if shared.group_rps:
            room = min(room, self._rate(group).room())
        if shared.group_quota_limit:
            room = min(room, shared.group_quota_limit - self._used(group))
        return room

    def _rate(self, group: str) -> Gcra:
        shared = self._shared
        return Gcra(shared.group_rps, shared.group_burst, self._limits.group_tat.get(group), self._now)

    def _used(self, group: str) -> int:
        """The units of ``group``'s current quota window used (all of them in a window older
        than the one kept: the clock stepped back, and its count is unknown)."""
        kept = self._limits.group_windows.get(group)
        if kept is None or self._window is None:
            return 0
        start, used = kept
        if start > self._window:
            return self._shared.group_quota_limit
        return used if start == self._window else 0

    def spend(self, leases: list[Lease]) -> None:
        """Move each group's rate on and count its quota, by the tasks it started."""
        started = Counter(lease.task.group for lease in leases if lease.task.group is not None)
        limits, shared = self._limits, self._shared
        for group, n in started.items():
            if shared.group_rps:
                rate = self._rate(group)
                rate.spend(n)
                limits.group_tat[group] = rate.tat
            if shared.group_quota_limit and self._window is not None:
                limits.group_windows[group] = (self._window, self._used(group) + n)


class _Once:
    """``ask()`` called at most once, and only when an answer depends on it (whether tasks
    are left due); cheaper than `functools.cache` made anew per claim."""

    __slots__ = ("_answer", "_ask")

    def __init__(self, ask: Callable[[], bool]) -> None:
        self._ask = ask
        self._answer: bool | None = None

    def __call__(self) -> bool:
        if self._answer is None:
            self._answer = self._ask()
        return self._answer
