"""`RedisBroker`: the broker protocol over Redis, one Lua script per transition."""

from __future__ import annotations

import builtins
import functools
import logging
import threading
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Generic, TypeVar

from taskgate.brokers.base import (
    UNSET,
    AckItem,
    AckOutcome,
    Capabilities,
    FailureKind,
    Lease,
    LimitedClaim,
    NewTask,
    QuietAckOutcome,
    QuotaClaim,
    QuotaGrant,
    QuotaSpec,
    Renewal,
    SettledSink,
    Unset,
    check_identifier,
)
from taskgate.brokers.checks import (
    check_ack_items,
    check_bytes,
    check_claim,
    check_count,
    check_duration,
    check_failure,
    check_new_tasks,
    check_queues,
    check_quota_claim,
    check_quota_request,
    check_retry_delay,
    check_timeout,
)
from taskgate.brokers.redis.codec import (
    SNAPSHOT_FIELDS,
    arrival_statuses,
    arrived_tasks,
    enqueue_args,
    enqueued,
    enqueued_arrivals,
    from_us,
    lease_from_values,
    task_from_values,
    to_us,
    ttl_us,
)
from taskgate.brokers.redis.connection import check_timeout as check_socket_timeout
from taskgate.brokers.redis.connection import open_clients
from taskgate.brokers.redis.keys import DEFAULT_PREFIX, KeySpace
from taskgate.brokers.redis.limits import RedisLimits, check_rate, check_tokens
from taskgate.brokers.redis.replies import unwrap
from taskgate.brokers.redis.scripts import ScriptBook, redis_errors
from taskgate.brokers.redis.waiter import SignalWaiter
from taskgate.brokers.split import SplitCall
from taskgate.clock import Clock
from taskgate.errors import BrokerError, LeaseLostError, TaskNotFoundError
from taskgate.ids import new_tokens
from taskgate.task import Filter, Status, Task

__all__ = ["RedisBroker"]

log = logging.getLogger("taskgate")

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
        cross_process=True,
        distributed_limits=True,
        push_wakeups=True,
        quiet_acks=True,
        quiet_enqueue=True,
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
        self._limits = RedisLimits(self._run, self._client, self._keys)
        self._close_lock = threading.Lock()
        self._closed = False
        self._sink: SettledSink | None = None

    def __repr__(self) -> str:
        state = " closed" if self._closed else ""
        return f"<RedisBroker prefix={self._keys.prefix!r}{state}>"

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
        """Send the request of one of the hot methods (submits, claims, acks, transitions of a
        running task, cancels, `get`) from the event loop; see
        `taskgate.brokers.split.SplitCaller`. Anything else, a Cluster or TLS client, or no idle
        connection for it: None, nothing sent."""
        if isinstance(method, functools.partial):  # settings bound by the runtime (limits.py)
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

    def enqueue(self, tasks: Sequence[NewTask]) -> builtins.list[Task]:
        """Store ``tasks`` all-or-nothing and return their snapshots in the same order.

        Besides the protocol's errors: an id already in use, or two tasks of the batch with
        one id or one business key, raise `ValueError`.
        """
        return self._call(self._plan_enqueue(tasks))

    def _plan_enqueue(self, tasks: Sequence[NewTask]) -> _Request[builtins.list[Task]]:
        items = check_new_tasks(tasks)

        def answer(reply: builtins.list[Any]) -> builtins.list[Task]:
            return arrived_tasks(items, *enqueued(unwrap(reply))) if reply else []

        if not items:
            return self._request(None, [], answer)
        return self._request("enqueue", enqueue_args(items), answer)

    def enqueue_quiet(self, tasks: Sequence[NewTask]) -> builtins.list[Status]:
        """`enqueue`, answering each task's status on arrival instead of its snapshot."""
        return self._call(self._plan_enqueue_quiet(tasks))

    def _plan_enqueue_quiet(self, tasks: Sequence[NewTask]) -> _Request[builtins.list[Status]]:
        items = check_new_tasks(tasks)
        if not items:
            return self._request(None, [], lambda reply: [])
        return self._request("enqueue", enqueue_args(items), _arrival_statuses)

    def replay(
        self,
        execution_id: str,
        *,
        new_id: str,
        allow_completed: bool = False,
        payload: bytes | Unset | None = UNSET,
    ) -> Task:
        """Create execution ``new_id`` re-running ``execution_id``, atomically with the checks.

        Checks in this order: `TaskNotFoundError`, `ReplayNotFinalError`,
        `AlreadyReplayedError`, `CompletedNotAllowedError`; ``new_id`` in use: `ValueError`.
        """
        check_identifier(execution_id, what="execution_id")
        check_identifier(new_id, what="new_id")
        check_bytes(payload, what="payload", allow_unset=True)
        if isinstance(payload, Unset):
            mode, body = "keep", b""
        else:
            mode, body = ("none", b"") if payload is None else ("bytes", payload)
        args = [execution_id, new_id, 1 if allow_completed else 0, mode, body]
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

        Cost: one filter (or none) reads O(log N + page) from its index; several intersect
        their indexes, O(candidates); a business key reads its executions only.
        """
        if not isinstance(filter, Filter):
            raise TypeError(f"list takes a Filter, got {type(filter).__name__}")
        args: builtins.list[Any] = [filter.offset, filter.limit]
        for name in ("type", "queue", "status", "business_key"):
            value = getattr(filter, name)
            if value is not None:
                args.extend([name, str(value)])
        return [task_from_values(snapshot) for snapshot in self._run("list", args)]

    def history(self, business_key: str) -> builtins.list[Task]:
        """Every execution of ``business_key``, oldest first; ``[]`` for an unknown key."""
        check_identifier(business_key, what="business_key")
        return [task_from_values(snapshot) for snapshot in self._run("history", [business_key])]

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

    def queue_length(self, queue: str) -> int:
        """How many tasks of ``queue`` are pending or retrying (due or not): one ``ZCARD``."""
        check_identifier(queue, what="queue")
        self._check_open()
        with redis_errors("queue_length"):
            return int(self._client.zcard(self._keys.queue(queue)))

    # -- tasks: the worker's transitions ---------------------------------------------------

    def claim(self, queue: str, limit: int, lease_ttl: timedelta) -> builtins.list[Lease]:
        """Lease up to ``limit`` due tasks of ``queue``, oldest due first (``run_at``, then id)."""
        return self._call(self._plan_claim(queue, limit, lease_ttl))

    def _plan_claim(self, queue: str, limit: int, lease_ttl: timedelta) -> _Request[builtins.list[Lease]]:
        check_claim(queue, limit, lease_ttl)
        return self._request("claim", [queue, ttl_us(lease_ttl), *new_tokens(limit)], _leases)

    def claim_within_quota(
        self, queue: str, limit: int, lease_ttl: timedelta, *, key: str, quota_limit: int, period: timedelta
    ) -> QuotaClaim:
        """`claim` and `reserve_quota` in one script: a unit of ``key`` per task claimed."""
        return self._call(
            self._plan_claim_within_quota(
                queue, limit, lease_ttl, key=key, quota_limit=quota_limit, period=period
            )
        )

    def _plan_claim_within_quota(
        self, queue: str, limit: int, lease_ttl: timedelta, *, key: str, quota_limit: int, period: timedelta
    ) -> _Request[QuotaClaim]:
        args = _quota_claim_args(queue, limit, lease_ttl, key, quota_limit, period)
        return self._request(
            "claim_quota", args, lambda reply: _quota_claimed(unwrap(reply), key, quota_limit, period)
        )

    def heartbeat(self, task_id: str, token: str, lease_ttl: timedelta) -> Renewal:
        """Extend the lease to ``now + lease_ttl`` and report whether a cancel was requested.

        An expired lease that no reaper took back yet is still held and can be renewed.
        """
        return self._call(self._plan_heartbeat(task_id, token, lease_ttl))

    def _plan_heartbeat(self, task_id: str, token: str, lease_ttl: timedelta) -> _Request[Renewal]:
        _check_lease(task_id, token)
        check_duration(lease_ttl, what="lease_ttl", positive=True)
        return self._request("heartbeat", [task_id, token, ttl_us(lease_ttl)], _renewal)

    def ack(self, task_id: str, token: str, result: bytes | None) -> Task:
        """Complete the task with ``result`` and, in the same script, wake children now ready.

        A cancel mark does not stop an ack: the work is done, so the task completes.
        """
        return self._call(self._plan_ack(task_id, token, result))

    def _plan_ack(self, task_id: str, token: str, result: bytes | None) -> _Request[Task]:
        _check_lease(task_id, token)
        check_bytes(result, what="result")
        return self._transition("ack", [task_id, token, 0 if result is None else 1, result or b""])

    def ack_many(self, items: Sequence[AckItem]) -> builtins.list[AckOutcome]:
        """`ack` every ``(task_id, token, result)`` in ONE script; one answer per item, in order.

        A stale token or unknown id answers its own item with the error `ack` would raise.
        """
        return self._call(self._plan_ack_many(items))

    def _plan_ack_many(self, items: Sequence[AckItem]) -> _Request[builtins.list[AckOutcome]]:
        return self._acks("snapshots", items, _ack_answer)

    def ack_many_quiet(self, items: Sequence[AckItem]) -> builtins.list[QuietAckOutcome]:
        """`ack_many`, answering None instead of the snapshot for each task it completed: the
        script reads each task's status fields alone and its reply carries no task."""
        return self._call(self._plan_ack_many_quiet(items))

    def _plan_ack_many_quiet(self, items: Sequence[AckItem]) -> _Request[builtins.list[QuietAckOutcome]]:
        return self._acks("quiet", items, _quiet_ack_answer)

    def _acks(
        self, mode: str, items: Sequence[AckItem], each: Callable[[Any], T]
    ) -> _Request[builtins.list[T]]:
        args = _ack_many_args(mode, items)

        def answer(reply: builtins.list[Any]) -> builtins.list[T]:
            return [each(item) for item in unwrap(reply)] if reply else []

        return self._request("ack_many" if args[1] else None, args, answer)

    def claim_after_acks(
        self, items: Sequence[AckItem], queue: str, limit: int, lease_ttl: timedelta
    ) -> tuple[builtins.list[QuietAckOutcome], builtins.list[Lease] | None]:
        """`ack_many_quiet` of ``items``, then `claim` of ``queue``: one script, one round trip.

        A claim that fails once the acks are written is logged and answered with None.
        """
        return self._call(self._plan_claim_after_acks(items, queue, limit, lease_ttl))

    def _plan_claim_after_acks(
        self, items: Sequence[AckItem], queue: str, limit: int, lease_ttl: timedelta
    ) -> _Request[tuple[builtins.list[QuietAckOutcome], builtins.list[Lease] | None]]:
        acks = _ack_many_args("quiet", items)
        check_claim(queue, limit, lease_ttl)
        claim = [queue, ttl_us(lease_ttl), *new_tokens(limit)]
        return self._after_acks("ack_claim", acks, claim, _claimed_leases)

    def claim_within_quota_after_acks(
        self,
        items: Sequence[AckItem],
        queue: str,
        limit: int,
        lease_ttl: timedelta,
        *,
        key: str,
        quota_limit: int,
        period: timedelta,
    ) -> tuple[builtins.list[QuietAckOutcome], QuotaClaim | None]:
        """`ack_many_quiet` of ``items``, then `claim_within_quota`: one script, one round trip.

        A claim that fails once the acks are written is logged and answered with None.
        """
        return self._call(
            self._plan_claim_within_quota_after_acks(
                items, queue, limit, lease_ttl, key=key, quota_limit=quota_limit, period=period
            )
        )

    def _plan_claim_within_quota_after_acks(
        self,
        items: Sequence[AckItem],
        queue: str,
        limit: int,
        lease_ttl: timedelta,
        *,
        key: str,
        quota_limit: int,
        period: timedelta,
    ) -> _Request[tuple[builtins.list[QuietAckOutcome], QuotaClaim | None]]:
        acks = _ack_many_args("quiet", items)
        claim = _quota_claim_args(queue, limit, lease_ttl, key, quota_limit, period)
        return self._after_acks(
            "ack_claim_quota", acks, claim, lambda values: _quota_claimed(values, key, quota_limit, period)
        )

    def claim_with_limits_after_acks(
        self,
        items: Sequence[AckItem],
        queue: str,
        capacity: int,
        limit: int,
        lease_ttl: timedelta,
        *,
        rps: float = 0.0,
        burst: int = 0,
        quota: QuotaSpec | None = None,
        release: Sequence[str] = (),
        claimer: str = "",
    ) -> tuple[builtins.list[QuietAckOutcome], LimitedClaim | None]:
        """`ack_many_quiet` of ``items``, then `claim_with_limits`: one script, one round trip.

        A claim that fails once the acks are written is logged and answered with None (the
        slots of ``release`` may not be back).
        """
        return self._call(
            self._plan_claim_with_limits_after_acks(
                items,
                queue,
                capacity,
                limit,
                lease_ttl,
                rps=rps,
                burst=burst,
                quota=quota,
                release=release,
                claimer=claimer,
            )
        )

    def _plan_claim_with_limits_after_acks(
        self,
        items: Sequence[AckItem],
        queue: str,
        capacity: int,
        limit: int,
        lease_ttl: timedelta,
        *,
        rps: float = 0.0,
        burst: int = 0,
        quota: QuotaSpec | None = None,
        release: Sequence[str] = (),
        claimer: str = "",
    ) -> _Request[tuple[builtins.list[QuietAckOutcome], LimitedClaim | None]]:
        acks = _ack_many_args("quiet", items)
        claim = _limited_claim_args(queue, capacity, limit, lease_ttl, rps, burst, quota, release, claimer)
        return self._after_acks(
            "ack_claim_limited", acks, claim, lambda values: _limited_claim(values, quota)
        )

    def _after_acks(
        self,
        chain: str,
        acks: Sequence[Any],
        claim: Sequence[Any],
        claimed: Callable[[builtins.list[Any]], T],
    ) -> _Request[tuple[builtins.list[QuietAckOutcome], T | None]]:
        """Plan ``chain`` (quiet ``ack_many``, then a claim): the acks' answers and the claim's
        answer (``claimed`` of its values), None when the claim failed after the acks were written."""

        def answer(reply: builtins.list[Any]) -> tuple[builtins.list[QuietAckOutcome], T | None]:
            acked, *claim_reply = reply
            answers = [_quiet_ack_answer(item) for item in unwrap(acked)]
            (claim_values,) = claim_reply  # the acks answered "ok": the claim ran
            if claim_values[0] != b"ok":
                log.warning("the claim after %d ack(s) failed: %s", len(answers), _failure_text(claim_values))
                return answers, None
            return answers, claimed(unwrap(claim_values))

        return self._request(chain, [len(acks), *acks, *claim], answer)

    def retry(self, task_id: str, token: str, *, kind: FailureKind, error: str, delay: timedelta) -> Task:
        """Count the failure by ``kind`` and set ``retrying`` due at ``now + delay``.

        If a cancel was requested meanwhile, the failure is still counted and recorded, and
        the task is canceled (with cascade) instead of retried.
        """
        return self._call(self._plan_retry(task_id, token, kind=kind, error=error, delay=delay))

    def _plan_retry(
        self, task_id: str, token: str, *, kind: FailureKind, error: str, delay: timedelta
    ) -> _Request[Task]:
        _check_lease(task_id, token)
        kind, error = check_failure(kind, error)
        delay = check_retry_delay(delay)
        return self._transition("retry", [task_id, token, kind.value, error, ttl_us(delay)])

    def fail(self, task_id: str, token: str, *, kind: FailureKind, error: str) -> Task:
        """Count the failure by ``kind``, set ``failed``, cancel descendants (cascade)."""
        return self._call(self._plan_fail(task_id, token, kind=kind, error=error))

    def _plan_fail(self, task_id: str, token: str, *, kind: FailureKind, error: str) -> _Request[Task]:
        _check_lease(task_id, token)
        kind, error = check_failure(kind, error)
        return self._transition("fail", [task_id, token, kind.value, error])

    def requeue(self, task_id: str, token: str) -> Task:
        """Put a running task back to ``pending``, due now, touching no counter.

        If a cancel was requested meanwhile, cancels instead (with cascade).
        """
        return self._call(self._plan_requeue(task_id, token))

    def _plan_requeue(self, task_id: str, token: str) -> _Request[Task]:
        _check_lease(task_id, token)
        return self._transition("requeue", [task_id, token])

    def finish_canceled(self, task_id: str, token: str) -> Task:
        """End a running task whose handler was stopped by a cancel: ``canceled`` + cascade."""
        return self._call(self._plan_finish_canceled(task_id, token))

    def _plan_finish_canceled(self, task_id: str, token: str) -> _Request[Task]:
        _check_lease(task_id, token)
        return self._transition("finish_canceled", [task_id, token])

    def _transition(self, name: str, args: Sequence[Any]) -> _Request[Task]:
        return self._request(name, args, _one_task)

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
        return self._transition("cancel", [task_id])

    def reap(self, *, lease_lost_max: int, limit: int = 1000) -> builtins.list[Task]:
        """Take back up to ``limit`` running tasks whose lease ended (``expires_at <= now``).

        Earliest expiry first. Each gets ``lease_lost += 1``; then a cancel-marked task is
        canceled, a task at ``lease_lost_max`` fails, any other goes back to ``pending`` due now.
        """
        check_count(lease_lost_max, what="lease_lost_max", minimum=1)
        check_count(limit, what="reap limit", minimum=1)
        return [task_from_values(snapshot) for snapshot in self._run("reap", [lease_lost_max, limit])]

    # -- quota and distributed limits (see limits.py) --------------------------------------

    def reserve_quota(self, key: str, limit: int, period: timedelta, n: int = 1) -> QuotaGrant:
        """Take up to ``n`` units of the current window of ``key`` (epoch-aligned ``period``).

        Fails closed: Redis unreachable raises `BrokerError`, never a grant.
        """
        return self._limits.reserve_quota(key, limit, period, n)

    def release_quota(self, grant: QuotaGrant, n: int) -> None:
        """Give back ``n`` (0 … ``grant.granted``) units to the window they came from (never below 0)."""
        self._limits.release_quota(grant, n)

    def acquire_slots(self, queue: str, capacity: int, n: int, ttl: timedelta) -> builtins.list[str]:
        """Take up to ``n`` of the queue's ``capacity`` slots (global), each expiring after ``ttl``."""
        return self._limits.acquire_slots(queue, capacity, n, ttl)

    def claim_with_limits(
        self,
        queue: str,
        capacity: int,
        limit: int,
        lease_ttl: timedelta,
        *,
        rps: float = 0.0,
        burst: int = 0,
        quota: QuotaSpec | None = None,
        release: Sequence[str] = (),
        claimer: str = "",
    ) -> LimitedClaim:
        """Claim up to ``limit`` due tasks, each under one of the queue's ``capacity`` global
        slots, taking per task claimed a start of the queue's global rate (``rps`` > 0) and a
        unit of ``quota`` -- one script, spent only for tasks claimed. Each slot's token is its
        lease's token and expires with the lease (renew and release it by that token).
        The slots of ``release`` are given back first, in the same script; claimers with a
        ``claimer`` id take turns at slots (see claim_limited.lua)."""
        return self._call(
            self._plan_claim_with_limits(
                queue,
                capacity,
                limit,
                lease_ttl,
                rps=rps,
                burst=burst,
                quota=quota,
                release=release,
                claimer=claimer,
            )
        )

    def _plan_claim_with_limits(
        self,
        queue: str,
        capacity: int,
        limit: int,
        lease_ttl: timedelta,
        *,
        rps: float = 0.0,
        burst: int = 0,
        quota: QuotaSpec | None = None,
        release: Sequence[str] = (),
        claimer: str = "",
    ) -> _Request[LimitedClaim]:
        args = _limited_claim_args(queue, capacity, limit, lease_ttl, rps, burst, quota, release, claimer)
        return self._request("claim_limited", args, lambda reply: _limited_claim(unwrap(reply), quota))

    def renew_slots(self, queue: str, tokens: Sequence[str], ttl: timedelta) -> builtins.list[str]:
        """Extend held slots to ``now + ttl``; returns the tokens that were no longer held."""
        return self._limits.renew_slots(queue, tokens, ttl)

    def release_slots(self, queue: str, tokens: Sequence[str]) -> None:
        """Give slots back; a token not held is ignored (released at most once)."""
        self._check_open()
        self._limits.release_slots(queue, tokens)

    def take_rate(self, queue: str, rps: float, burst: int, n: int) -> tuple[int, float]:
        """Take up to ``n`` starts from the queue's global GCRA limiter: ``(granted, retry_after)``."""
        return self._limits.take_rate(queue, rps, burst, n)

    # -- what transitions settle on their own -----------------------------------------------

    def report_settled(self, sink: SettledSink | None) -> None:
        """Give ``sink`` the snapshots of the tasks each later call settles on its own (see
        `taskgate.brokers.base.Broker.report_settled`): the scripts read them where they settle
        and reply them after their own answer; None stops it."""
        self._sink = sink

    # -- wake-ups and lifecycle -------------------------------------------------------------

    def wait_for_work(self, queues: Collection[str], timeout: float) -> bool:
        """Block up to ``timeout`` seconds until work may be due in ``queues``.

        True when an enqueue/requeue/retry/wake-up in any process signalled one of
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


def _leases(reply: builtins.list[Any]) -> builtins.list[Lease]:
    return [lease_from_values(snapshot) for snapshot in unwrap(reply)]


def _claimed_leases(values: builtins.list[Any]) -> builtins.list[Lease]:
    return [lease_from_values(snapshot) for snapshot in values]


def _arrival_statuses(reply: builtins.list[Any]) -> builtins.list[Status]:
    return arrival_statuses(enqueued_arrivals(unwrap(reply)))


def _renewal(reply: builtins.list[Any]) -> Renewal:
    until, cancel = unwrap(reply)
    return Renewal(expires_at=from_us(until), cancel_requested=cancel == b"1")


def _one_task(reply: builtins.list[Any]) -> Task:
    (snapshot,) = unwrap(reply)
    return task_from_values(snapshot)


def _limited_claim_args(
    queue: str,
    capacity: int,
    limit: int,
    lease_ttl: timedelta,
    rps: float,
    burst: int,
    quota: QuotaSpec | None,
    release: Sequence[str],
    claimer: str,
) -> builtins.list[Any]:
    """The arguments of ``claim_limited`` after ``now`` (checked: bad input raises here)."""
    check_identifier(queue, what="queue")
    check_identifier(claimer, what="claimer", allow_empty=True)
    released = check_tokens(release)
    check_count(capacity, what="slot capacity", minimum=1)
    check_count(limit, what="claim limit", minimum=1)
    check_duration(lease_ttl, what="lease_ttl", positive=True)
    rate, size = check_rate(rps, burst)
    if quota is not None:
        check_quota_request(quota.key, quota.limit, quota.period, 0)
    quota_args = ["", 0, 0] if quota is None else [quota.key, quota.limit, ttl_us(quota.period)]
    return [
        queue,
        capacity,
        ttl_us(lease_ttl),
        repr(rate),
        size,
        *quota_args,
        claimer,
        len(released),
        *released,
        *new_tokens(limit),
    ]


def _limited_claim(reply: Sequence[Any], quota: QuotaSpec | None) -> LimitedClaim:
    """A ``claim_limited`` reply (after "ok") as a `LimitedClaim`."""
    retry_after, start_us, left, *snapshots = reply
    leases = [lease_from_values(snapshot) for snapshot in snapshots]
    return LimitedClaim(
        leases=leases,
        retry_after=float(retry_after),
        quota=_quota_claim(quota, start_us, int(left), leases),
    )


def _quota_claim(
    quota: QuotaSpec | None, start_us: Any, left: int, leases: builtins.list[Lease]
) -> QuotaClaim | None:
    """The quota side of a ``claim_limited`` reply (None when no quota was asked for)."""
    if quota is None:
        return None
    start = from_us(start_us)
    grant = QuotaGrant(
        key=quota.key,
        window_start=start,
        window_end=start + quota.period,
        granted=len(leases),
        limit=quota.limit,
    )
    return QuotaClaim(leases=leases, grant=grant, exhausted=left <= 0)


def _check_lease(task_id: object, token: object) -> None:
    check_identifier(task_id, what="task id")
    if not isinstance(token, str):
        raise TypeError(f"lease token must be a str, got {type(token).__name__}")


def _ack_answer(reply: Sequence[Any]) -> AckOutcome:
    """One item of an ack_many reply: the snapshot, or the error of that item alone."""
    try:
        (snapshot,) = unwrap(reply)
    except (LeaseLostError, TaskNotFoundError) as exc:
        return exc
    return task_from_values(snapshot)


def _quota_claim_args(
    queue: str, limit: int, lease_ttl: timedelta, key: str, quota_limit: int, period: timedelta
) -> builtins.list[Any]:
    """The arguments of ``claim_quota`` after ``now`` (checked: bad input raises here)."""
    check_quota_claim(queue, limit, lease_ttl, key, quota_limit, period)
    return [queue, ttl_us(lease_ttl), key, quota_limit, ttl_us(period), *new_tokens(limit)]


def _quota_claimed(reply: Sequence[Any], key: str, quota_limit: int, period: timedelta) -> QuotaClaim:
    """A ``claim_quota`` reply (after "ok") as a `QuotaClaim`."""
    start_us, left, *snapshots = reply
    start = from_us(start_us)
    claimed = [lease_from_values(snapshot) for snapshot in snapshots]
    grant = QuotaGrant(
        key=key, window_start=start, window_end=start + period, granted=len(claimed), limit=quota_limit
    )
    return QuotaClaim(leases=claimed, grant=grant, exhausted=int(left) <= 0)


def _ack_many_args(mode: str, items: Sequence[AckItem]) -> builtins.list[Any]:
    """The arguments of ``ack_many`` after ``now`` (checked: bad items raise here)."""
    checked = check_ack_items(items)
    args: builtins.list[Any] = [mode, len(checked)]
    for task_id, token, result in checked:
        args.extend([task_id, token, 0 if result is None else 1, result or b""])
    return args


def _failure_text(reply: Sequence[Any]) -> str:
    """The second part of a chained script that raised: ``{"failed", message}`` as text."""
    return " ".join(v.decode(errors="replace") if isinstance(v, bytes) else str(v) for v in reply)


def _quiet_ack_answer(reply: Sequence[Any]) -> QuietAckOutcome:
    """One item of a quiet ack_many reply: None for a completed task, or that item's error."""
    try:
        unwrap(reply)
    except (LeaseLostError, TaskNotFoundError) as exc:
        return exc
    return None


def _flat_list(reply: Any) -> builtins.list[bytes]:
    """A ``HGETALL`` reply as the flat list the codec reads (redis-py may give a dict)."""
    if isinstance(reply, dict):
        return [item for pair in reply.items() for item in pair]
    return builtins.list(reply)


def _pairs(reply: Any) -> builtins.list[tuple[bytes, bytes]]:
    flat = _flat_list(reply)
    return [(flat[i], flat[i + 1]) for i in range(0, len(flat), 2)]


# The methods `RedisBroker.split` sends from the event loop, each with the plan of its call.
_SPLIT_PLANS: dict[object, Callable[..., _Request[Any]]] = {
    getattr(RedisBroker, name): getattr(RedisBroker, f"_plan_{name}")
    for name in (
        "get",
        "enqueue",
        "enqueue_quiet",
        "claim",
        "claim_within_quota",
        "heartbeat",
        "ack",
        "ack_many",
        "ack_many_quiet",
        "claim_after_acks",
        "claim_within_quota_after_acks",
        "claim_with_limits_after_acks",
        "retry",
        "fail",
        "requeue",
        "finish_canceled",
        "cancel",
        "claim_with_limits",
    )
}
