"""`RedisBroker`: the broker protocol over Redis, one Lua script per transition."""

from __future__ import annotations

import builtins
import functools
import threading
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Generic, TypeVar

from taskgate.brokers.base import Capabilities, SettledSink, Unset, check_identifier
from taskgate.brokers.checks import check_count, check_queues, check_timeout
from taskgate.brokers.params import (
    Claim,
    Claimed,
    Compensation,
    Heartbeat,
    Hold,
    ItemAnswer,
    Prune,
    QueueQuery,
    QueueState,
    QuotaUsage,
    Renewal,
    Replay,
    Settle,
    Step,
    Submit,
    Submitted,
    check_compensations,
)
from taskgate.brokers.redis.claims import claim_call
from taskgate.brokers.redis.codec import (
    SNAPSHOT_FIELDS,
    arrival_statuses,
    arrived_tasks,
    enqueue_args,
    enqueued,
    enqueued_arrivals,
    from_us,
    hold_from,
    task_from_values,
    to_us,
    ttl_us,
)
from taskgate.brokers.redis.connection import check_timeout as check_socket_timeout
from taskgate.brokers.redis.connection import open_clients
from taskgate.brokers.redis.keys import DEFAULT_PREFIX, KeySpace
from taskgate.brokers.redis.replies import unwrap
from taskgate.brokers.redis.scripts import ScriptBook, redis_errors
from taskgate.brokers.redis.settles import settle_call
from taskgate.brokers.redis.waiter import SignalWaiter
from taskgate.brokers.split import SplitCall
from taskgate.clock import Clock
from taskgate.errors import BrokerError, TaskNotFoundError
from taskgate.ids import new_id
from taskgate.task import Filter, Status, Task

__all__ = ["RedisBroker"]

DEFAULT_SOCKET_TIMEOUT = 5.0

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class _Request(Generic[T]):
    """One script call planned by a method: its script (None: nothing to send), its ARGV
    ("now" first), and how the script's whole reply becomes the method's answer; or a plain
    command (``plain``)."""

    script: str | None
    args: builtins.list[Any]
    answer: Callable[[builtins.list[Any]], T]
    # A plain command instead: ``args`` is the whole request (name and arguments), named
    # ``script`` in errors.
    plain: bool = False


class RedisBroker:
    """Tasks in Redis, shared by every process using the same server and ``key_prefix``.

    ``url_or_client`` is a ``redis://``/``rediss://``/``unix://`` URL (the broker opens and
    closes its own connection pools) or a redis-py ``Redis``/``RedisCluster`` client with
    ``decode_responses=False`` (the caller keeps owning it). Every multi-step transition is
    one Lua script. Time is Redis's ``TIME``, read inside the scripts, unless ``clock`` is
    given; then every time read or written is ``clock.now()``. ``socket_timeout`` (seconds)
    bounds every call: an unreachable server raises `BrokerError` within it. Key layout:
    this package's README.
    """

    capabilities = Capabilities(
        shared_quota=True,
        shared_limits=True,
        group_limits=True,
        cross_process=True,
        push_wakeups=True,
        acks_in_claims=True,
        split_calls=True,
    )

    def __init__(
        self,
        url_or_client: Any,
        *,
        key_prefix: str = DEFAULT_PREFIX,
        clock: Clock | None = None,
        socket_timeout: float = DEFAULT_SOCKET_TIMEOUT,
    ) -> None:
        self._keys = KeySpace(key_prefix)
        self._clock = clock
        self._clients = open_clients(url_or_client, check_socket_timeout(socket_timeout))
        self._client = self._clients.main
        self._scripts = ScriptBook(self._client)
        self._waiter = SignalWaiter(self._clients.waits, self._keys, self._run, self._clients.close)
        self._close_lock = threading.Lock()
        self._closed = False
        self._sink: SettledSink | None = None

    def __repr__(self) -> str:
        state = " closed" if self._closed else ""
        return f"<RedisBroker prefix={self._keys.prefix!r}{state}>"

    @property
    def clock(self) -> Clock | None:
        """The clock given at construction; None: the server's ``TIME``."""
        return self._clock

    @property
    def key_prefix(self) -> str:
        """The prefix given at construction; keys live under ``<prefix>{<tag>}:``."""
        return self._keys.prefix

    # -- the one place that decides "now" and runs scripts ----------------------------------

    def _now_arg(self) -> str:
        """ARGV[1] of every script: the injected clock's µs, or "" to use Redis ``TIME``."""
        return "" if self._clock is None else str(to_us(self._clock.now()))

    def _run(self, name: str, args: Sequence[Any]) -> builtins.list[Any]:
        """Run script ``name`` in this thread; its values after "ok" (`unwrap`)."""
        return self._call(self._request(name, args, unwrap))

    def _check_open(self) -> None:
        if self._closed:
            raise BrokerError("RedisBroker is closed")

    def _request(
        self, script: str | None, args: Sequence[Any], answer: Callable[[builtins.list[Any]], T]
    ) -> _Request[T]:
        """Plan a call of ``script``. While a sink is set, every script is asked for the
        snapshots of the tasks it settles on its own ("s" before "now", see ``_lib.lua``)
        and its reply carries them after its own."""
        self._check_open()
        if not script:
            return _Request(script, [], answer)
        sink = self._sink
        if sink is None:
            return _Request(script, [self._now_arg(), *args], answer)
        return _Request(script, ["s" + self._now_arg(), *args], _reporting(answer, sink))

    def _call(self, request: _Request[T]) -> T:
        """Run a planned call in this thread, waiting for its reply."""
        if request.script is None:
            return request.answer([])
        if request.plain:
            return request.answer(self._scripts.command(request.script, request.args))
        return request.answer(self._scripts.run(request.script, self._keys.base, request.args))

    def split(self, method: Callable[..., T], /, *args: Any, **kwargs: Any) -> SplitCall[T] | None:
        """Send the request of one of the hot verbs (`submit`, `claim`, `settle`, `heartbeat`,
        `cancel`, `get`) from the event loop; see `taskgate.brokers.split.SplitCaller`. Anything
        else, a Cluster or TLS client, or no idle connection for it: None, nothing sent."""
        if isinstance(method, functools.partial):  # arguments bound ahead by a caller
            args, kwargs = (*method.args, *args), {**method.keywords, **kwargs}
            method = method.func
        # Keyed by RedisBroker's own functions: a subclass's override runs whole, in a thread.
        plan = _SPLIT_PLANS.get(getattr(method, "__func__", None))
        bound_to = getattr(method, "__self__", None)
        if plan is None or bound_to is None or id(bound_to) != id(self):  # (not "is not": mypy)
            return None
        if not self._scripts.loop_connections.usable:
            return None
        request: _Request[T] = plan(self, *args, **kwargs)
        if request.script is None:
            return None
        if request.plain:
            return self._scripts.start_command(request.script, request.args, request.answer)
        return self._scripts.start(request.script, self._keys.base, request.args, request.answer)

    # -- tasks: create ---------------------------------------------------------------------

    def submit(self, submit: Submit) -> Submitted:
        """Store ``submit.tasks`` all-or-nothing (one ``enqueue.lua``); see `Broker.submit`.

        Besides the protocol's errors: an id already in use, or two tasks of the batch with
        one id or one business key, raise `ValueError`. ``snapshots=False`` builds no snapshot:
        the script answers each task's arrival alone.
        """
        return self._call(self._plan_submit(submit))

    def _plan_submit(self, submit: Submit) -> _Request[Submitted]:
        items = submit.tasks
        if not items:
            return self._request(None, [], lambda reply: Submitted(statuses=[]))
        args = enqueue_args(items, submit.max_pending)
        if not submit.snapshots:
            return self._request("enqueue", args, _arrival_statuses)

        def answer(reply: builtins.list[Any]) -> Submitted:
            tasks = arrived_tasks(items, *enqueued(unwrap(reply)))
            return Submitted(statuses=[task.status for task in tasks], tasks=tasks)

        return self._request("enqueue", args, answer)

    def replay(self, replay: Replay) -> Task:
        """Create execution ``new_id`` re-running ``execution_id``, atomically with the checks.

        Checks in this order: `TaskNotFoundError`, `ReplayNotFinalError`,
        `AlreadyReplayedError`, `CompletedNotAllowedError`; ``new_id`` in use: `ValueError`.
        """
        payload = replay.payload
        if isinstance(payload, Unset):
            mode, body = "keep", b""
        else:
            mode, body = ("none", b"") if payload is None else ("bytes", payload)
        args = [replay.execution_id, replay.new_id, 1 if replay.allow_completed else 0, mode, body]
        args += [run_id for pair in replay.descendants for run_id in pair]
        (snapshot,) = self._run("replay", args)
        return task_from_values(snapshot)

    # -- tasks: read -----------------------------------------------------------------------

    def get(self, task_id: str) -> Task:
        """The current snapshot of ``task_id`` (one ``HMGET``)."""
        return self._call(self._plan_get(task_id))

    def _plan_get(self, task_id: str) -> _Request[Task]:
        check_identifier(task_id, what="task id")
        self._check_open()

        def answer(values: builtins.list[Any]) -> Task:
            if values[0] is None:
                raise TaskNotFoundError(f"no task with id {task_id!r}")
            return task_from_values(values)

        return _Request("get", ["HMGET", self._keys.task(task_id), *SNAPSHOT_FIELDS], answer, plain=True)

    def list(self, filter: Filter) -> builtins.list[Task]:
        """Tasks matching ``filter``, sorted by ``(created_at, id)``, then offset, then limit.

        A business key's executions come oldest first, in the order its list of executions
        holds them (the replay chain's, whatever the clock said).

        Cost: one filter (or none) reads O(log N + page) from its index; several intersect
        their indexes, O(candidates); a business key alone reads the page of its executions.
        """
        if not isinstance(filter, Filter):
            raise TypeError(f"list takes a Filter, got {type(filter).__name__}")
        if filter.business_key is not None:
            check_identifier(filter.business_key, what="business_key")
        args: builtins.list[Any] = [filter.offset, filter.limit]
        for name in ("type", "queue", "status", "business_key", "group", "parent"):
            value = getattr(filter, name)
            if value is not None:
                args.extend([name, str(value)])
        return [task_from_values(snapshot) for snapshot in self._run("list", args)]

    def counts(self) -> dict[str, dict[Status, int]]:
        """Task counts by type and status from the ``stats`` HASH; zero counts are absent."""
        self._check_open()
        with redis_errors("counts"):
            flat = self._client.execute_command("HGETALL", self._keys.stats())
        result: dict[str, dict[Status, int]] = {}
        for name, value in _pairs(flat):
            status, _, task_type = name.decode().partition(":")
            if int(value):
                result.setdefault(task_type, {})[Status(status)] = int(value)
        return result

    def queue_state(self, query: QueueQuery) -> QueueState:
        """How many tasks of ``query.queue`` are pending or retrying (due or not) -- the
        ``ZCARD`` of its queue --, ``query.quota``'s current window and the tasks
        ``query.unhandled`` names (a ``ZCOUNT`` per type of the queue it counts): one
        read-only script."""
        if not isinstance(query, QueueQuery):
            raise TypeError(f"queue_state takes a QueueQuery, got {type(query).__name__}")
        quota, unhandled = query.quota, query.unhandled
        args: builtins.list[Any] = [query.queue, "", 0, 0]
        if quota is not None:
            args[1:] = [quota.key, quota.limit, ttl_us(quota.period)]
        if unhandled is not None:
            args += [ttl_us(unhandled.after), "\0".join(unhandled.handled)]
        queue_len, held, start_us, used, *overdue = self._run("queue_state", args)
        usage = None
        if quota is not None:
            start = from_us(start_us)
            usage = QuotaUsage(quota.key, quota.limit, int(used), start, start + quota.period)
        return QueueState(int(queue_len), usage, hold_from(held), int(overdue[0]) if overdue else 0)

    def hold(self, hold: Hold) -> datetime | None:
        """Hold ``hold.queue`` (keeping a longer hold) or end its hold -- its ``hold:<queue>``
        key, one script (``hold.lua``); its hold after the call."""
        if not isinstance(hold, Hold):
            raise TypeError(f"hold takes a Hold, got {type(hold).__name__}")
        how = "resume" if hold.resume else "-1" if hold.for_ is None else ttl_us(hold.for_)
        (held,) = self._run("hold", [hold.queue, how])
        return hold_from(held)

    # -- tasks: the worker's transitions ---------------------------------------------------

    def claim(self, claim: Claim) -> Claimed:
        """Lease up to ``claim.limit`` due tasks in claim order (priority, ``run_at``, id), with
        what the claim carries -- acks, a quota, shared limits -- in ONE script (see `claims`).

        Shared limits: each lease holds one of the queue's ``workers`` slots under its token,
        expiring with the lease; ``release`` slots go back first; claimers with an id take
        turns at slots given back (``claim_limited.lua``). Acks are written quietly first; a
        claim part that fails after them answers `Claimed.failed`, the acks standing.
        """
        return self._call(self._plan_claim(claim))

    def _plan_claim(self, claim: Claim) -> _Request[Claimed]:
        return self._request(*claim_call(claim))

    def settle(self, settle: Settle) -> builtins.list[ItemAnswer]:
        """End the runs of ``settle.items`` and give back ``settle.give_back`` in ONE script
        (see `settles`); one answer per item, in order -- its snapshot (None without
        snapshots) or its own `LeaseLostError`/`TaskNotFoundError`.

        A cancel mark does not stop a `Complete`: the work is done, so the task completes.
        """
        return self._call(self._plan_settle(settle))

    def _plan_settle(self, settle: Settle) -> _Request[builtins.list[ItemAnswer]]:
        return self._request(*settle_call(settle))

    def heartbeat(self, heartbeat: Heartbeat) -> Renewal:
        """Extend the lease to ``now + lease_ttl`` -- with ``slot_queue``, the slot it holds
        there too, in the same script -- and report a requested cancel and a lost slot.

        An expired lease that no reaper took back yet is still held and can be renewed; an
        expired slot is not (another holder may have its capacity): ``slot_lost``.
        """
        return self._call(self._plan_heartbeat(heartbeat))

    def _plan_heartbeat(self, heartbeat: Heartbeat) -> _Request[Renewal]:
        args = [heartbeat.task_id, heartbeat.token, ttl_us(heartbeat.lease_ttl), heartbeat.slot_queue or ""]
        if heartbeat.progress is not None:
            args.append(heartbeat.progress)
        return self._request("heartbeat", args, _renewal)

    # -- tasks: anyone's transitions -------------------------------------------------------

    def cancel(self, task_id: str) -> Task:
        """Cancel a task.

        blocked/pending/retrying: ``canceled`` at once, with its descendants (cascade).
        running: only marked (again: no error); the holder sees it on its next heartbeat.
        Final: raises `AlreadyFinalError`.
        """
        return self._call(self._plan_cancel(task_id))

    def _plan_cancel(self, task_id: str) -> _Request[Task]:
        check_identifier(task_id, what="task id")
        return self._request("cancel", [task_id], _one_task)

    def prune(self, prune: Prune) -> int:
        """Delete up to ``prune.limit`` final tasks it names (see `Broker.prune`), oldest
        created first, with every key entry naming them -- one script (``prune.lua``), which
        looks at most ``4 * limit + 1000`` index entries per status; how many went."""
        if not isinstance(prune, Prune):
            raise TypeError(f"prune takes a Prune, got {type(prune).__name__}")
        queues = prune.queues or ()
        args: builtins.list[Any] = [
            ttl_us(prune.older_than),
            prune.limit,
            prune.type or "",
            prune.group or "",
        ]
        excluded = prune.exclude_queues
        args.extend((len(queues), *queues, len(excluded), *excluded))
        args.extend(status.value for status in prune.statuses)
        (deleted,) = self._run("prune", args)
        return int(deleted)

    def step(self, step: Step) -> bytes | None:
        """Read step ``step.name`` of ``step.task_id``, or store ``step.result`` unless one is
        stored (the first writer wins) -- the task's ``steps:<id>`` HASH, one script
        (``step.lua``); the result stored after the call, None when none is."""
        if not isinstance(step, Step):
            raise TypeError(f"step takes a Step, got {type(step).__name__}")
        args: builtins.list[Any] = [step.task_id, step.name]
        if step.result is not None:
            args.append(step.result)
        (stored,) = self._run("step", args)
        return None if stored is None else bytes(stored)

    def reap(
        self,
        *,
        lease_lost_max: int,
        limit: int = 1000,
        compensations: Mapping[str, Compensation] | None = None,
    ) -> builtins.list[Task]:
        """Take back up to ``limit`` running tasks whose lease ended (``expires_at <= now``).

        Earliest expiry first. Each gets ``lease_lost += 1``; then a cancel-marked task is
        canceled, a task at ``lease_lost_max`` fails (submitting its type's entry of
        ``compensations`` in the same script), any other goes back to ``pending`` due now.
        """
        check_count(lease_lost_max, what="lease_lost_max", minimum=1)
        check_count(limit, what="reap limit", minimum=1)
        args: builtins.list[Any] = [lease_lost_max, limit, new_id()]
        compensate = check_compensations(compensations)
        args.append(len(compensate))
        for task_type, comp in compensate.items():
            args.extend((task_type, comp.type, comp.queue, comp.max_retry))
        return [task_from_values(snapshot) for snapshot in self._run("reap", args)]

    # -- what transitions settle on their own -----------------------------------------------

    def report_settled(self, sink: SettledSink | None) -> None:
        """Give ``sink`` the snapshots of the tasks each later call settles on its own (see
        `taskgate.brokers.base.Broker.report_settled`): the scripts read them where they settle
        and reply them after their own answer; None stops it."""
        self._sink = sink

    # -- wake-ups and lifecycle -------------------------------------------------------------

    def wait_for_work(self, queues: Collection[str], timeout: float) -> bool:
        """Block up to ``timeout`` seconds until work may be due in ``queues``.

        True when a submit/requeue/retry/wake-up in any process signalled one of
        ``queues``, or when the earliest delayed task of one of them fell due (by the
        broker's clock, measured when the wait began); False on timeout, and within a
        fraction of a second once the broker is closed.
        """
        names = check_queues(queues)
        seconds = check_timeout(timeout)
        if self._closed:
            return False
        return self._waiter.wait(names, seconds)

    def close(self) -> None:
        """Wake every waiter and close the pools this broker opened; later calls raise. Idempotent."""
        with self._close_lock:
            if self._closed:
                return
            self._closed = True
        self._scripts.loop_connections.close()
        # The pools close once no wait is using them (at once when none is): closing a socket
        # under a blocked read would make redis-py raise in the waiter instead of waking it.
        with redis_errors("close"):
            self._waiter.close()


def _reporting(
    answer: Callable[[builtins.list[Any]], T], sink: SettledSink
) -> Callable[[builtins.list[Any]], T]:
    """``answer`` of a reply that carries the settled snapshots after the script's own reply:
    the script's answer, once those snapshots went to ``sink``."""

    def answered(reply: builtins.list[Any]) -> T:
        own, settled = reply
        result = answer(own)
        if settled:
            sink([task_from_values(snapshot) for snapshot in settled])
        return result

    return answered


def _arrival_statuses(reply: builtins.list[Any]) -> Submitted:
    return Submitted(statuses=arrival_statuses(enqueued_arrivals(unwrap(reply))))


def _renewal(reply: builtins.list[Any]) -> Renewal:
    until, cancel, slot_lost = unwrap(reply)
    return Renewal(expires_at=from_us(until), cancel_requested=cancel == b"1", slot_lost=slot_lost == 1)


def _one_task(reply: builtins.list[Any]) -> Task:
    (snapshot,) = unwrap(reply)
    return task_from_values(snapshot)


def _flat_list(reply: Any) -> builtins.list[bytes]:
    """A ``HGETALL`` reply as the flat list the codec reads (redis-py may give a dict)."""
    if isinstance(reply, dict):
        return [item for pair in reply.items() for item in pair]
    return builtins.list(reply)


def _pairs(reply: Any) -> builtins.list[tuple[bytes, bytes]]:
    flat = _flat_list(reply)
    return [(flat[i], flat[i + 1]) for i in range(0, len(flat), 2)]


# The verbs `RedisBroker.split` sends from the event loop, each with the plan of its call.
_SPLIT_PLANS: dict[object, Callable[..., _Request[Any]]] = {
    getattr(RedisBroker, name): getattr(RedisBroker, f"_plan_{name}")
    for name in ("get", "submit", "claim", "settle", "heartbeat", "cancel")
}
