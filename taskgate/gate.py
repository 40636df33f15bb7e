"""`Gate`: the public face of taskgate -- submit, query, cancel, replay, and run the workers.

The class stays thin: argument checks live in `taskgate.runtime.submission`, everything that
runs (schedulers, limits, leases, reaper, hooks) in `taskgate.runtime.runner.Runtime`. Every
broker call goes through the runtime's thread door (`BrokerCalls`).
"""

from __future__ import annotations

import builtins
import dataclasses
import json
from collections.abc import Callable, Iterable
from datetime import datetime
from types import TracebackType
from typing import Any, TypeVar

import anyio
from anyio.abc import TaskGroup, TaskStatus

from taskgate.backoff import Backoff
from taskgate.brokers.base import UNSET, Capabilities, NewTask, Unset, check_identifier
from taskgate.brokers.params import Compensation, Hold, Replay
from taskgate.brokers.split import SplitCaller
from taskgate.codec import encode_value
from taskgate.config import Config, QueueConfig
from taskgate.durations import DurationLike
from taskgate.enqueue import enqueue_in, in_transaction_broker
from taskgate.errors import (
    AlreadyFinalError,
    AlreadyReplayedError,
    CompletedNotAllowedError,
    ConfigError,
    ReplayNotFinalError,
    TaskFailedError,
    TaskNotFoundError,
)
from taskgate.ids import new_id
from taskgate.middleware import Middleware, check_middleware
from taskgate.runtime.backpressure import limits_of
from taskgate.runtime.executor import Handler
from taskgate.runtime.outcome import HandlerPolicy
from taskgate.runtime.purge import purge, purge_params
from taskgate.runtime.recovery import WAITING_STATUSES, descendants_to_rerun, replay_pairs, replay_statuses
from taskgate.runtime.runner import Runtime
from taskgate.runtime.stats import StatsReader
from taskgate.runtime.submission import build_tasks, pause_for, route, run_timeout
from taskgate.runtime.ticker import Ticker
from taskgate.schedules import Schedule
from taskgate.task import Filter, QueueStats, Status, Task

__all__ = ["DEFAULT_POLL_INTERVAL", "Gate"]

DEFAULT_POLL_INTERVAL = 0.2

H = TypeVar("H", bound=Handler)


class Gate:
    """Queues tasks and runs their handlers under the limits of ``config``.

    ``poll_interval`` (seconds) is how often idle queues look for delayed, retrying or
    other processes' tasks; ``reap_interval`` overrides the reaper period (default: half
    the smallest ``lease_ttl``).
    """

    def __init__(
        self,
        config: Config,
        *,
        poll_interval: float = DEFAULT_POLL_INTERVAL,
        reap_interval: float | None = None,
    ) -> None:
        if not isinstance(config, Config):
            raise ConfigError(f"Gate needs a taskgate.Config, got {type(config).__name__}")
        _check_broker(config)
        _check_positive("poll_interval", poll_interval)
        if reap_interval is not None:
            _check_positive("reap_interval", reap_interval)
        self.config = config
        self._handlers: dict[str, Handler] = {}
        self._policies: dict[str, HandlerPolicy] = {}
        self._runtime = Runtime(
            config,
            self._handlers,
            poll_interval=poll_interval,
            reap_interval=reap_interval,
            policies=self._policies,
        )
        self._stats = StatsReader(config, self._runtime)
        self._ticker = self._runtime.ticker = Ticker(config, self._runtime, self._submit)
        self._task_group: TaskGroup | None = None

    # -- handlers --------------------------------------------------------------------------------

    def handle(
        self,
        task_type: str,
        fn: Handler,
        *,
        retry_if: Callable[[Exception], object] | None = None,
        backoff: Backoff | None = None,
        timeout: DurationLike | None = None,
        on_failure: str | None = None,
    ) -> None:
        """Register ``fn`` for ``task_type``: ``async def fn(task)`` awaited, plain ``def`` in a thread.

        The gate claims only tasks of types it has handlers for; one registered while it runs
        is claimed from then on. ``retry_if(exc)`` decides whether an ordinary exception the
        handler raised is retried (false: the task fails at once; a ``retry_if`` that raises
        counts as false and is logged; called on the event loop, so keep it quick); `Throttled`
        and `SkipRetry` never reach it. ``backoff`` replaces its queue's (`QueueConfig.backoff`).
        ``timeout`` (a duration like `submit`'s) limits each run of the type, as its queue's
        `QueueConfig.timeout` would (a task's own ``submit(..., timeout=)`` still wins).
        ``on_failure`` names a compensation type: when a task of ``task_type`` becomes
        ``failed`` (retries used up, `SkipRetry`, or its lease lost ``lease_lost_max`` times),
        a task of that type is submitted in the same atomic unit as the failure, with payload
        ``{"failed": <the failed task's id>}``, no parents, and ``Config.max_retry``.
        Raises `ConfigError` when the type's queue (or ``on_failure``'s) has no limits
        configured, ``on_failure`` is ``task_type`` itself, the type has a handler already, or
        ``backoff`` is not a `Backoff`; `TypeError` for a ``fn`` or ``retry_if`` that is not
        callable, `TypeError`/`ValueError` naming a bad ``timeout`` or ``on_failure``.
        Nothing is registered then.
        """
        route(self.config, task_type)
        compensation = self._compensation(task_type, on_failure)
        if not callable(fn):
            raise TypeError(f"handler for {task_type!r} must be callable, got {fn!r}")
        if retry_if is not None and not callable(retry_if):
            raise TypeError(f"retry_if for {task_type!r} must be callable or None, got {retry_if!r}")
        if backoff is not None and not isinstance(backoff, Backoff):
            raise ConfigError(
                f"backoff for {task_type!r} must be a taskgate.Backoff or None, got {backoff!r}"
            )
        limit = run_timeout(timeout)
        if task_type in self._handlers:
            raise ConfigError(f"task type {task_type!r} already has a handler")
        if retry_if is not None or backoff is not None or limit is not None or compensation is not None:
            self._policies[task_type] = HandlerPolicy(backoff, retry_if, limit, compensation)
        self._handlers[task_type] = fn
        self._runtime.add_queue_for(task_type)

    def _compensation(self, task_type: str, on_failure: str | None) -> Compensation | None:
        """`handle`'s ``on_failure`` as the `Compensation` brokers submit, checked."""
        if on_failure is None:
            return None
        check_identifier(on_failure, what="on_failure")
        if on_failure == task_type:
            raise ConfigError(f"on_failure of {task_type!r} names the type itself; name a compensation type")
        try:
            queue = route(self.config, on_failure)
        except ConfigError as exc:
            raise ConfigError(f"on_failure of {task_type!r} cannot be routed: {exc}") from None
        return Compensation(on_failure, queue, max_retry=self.config.max_retry)

    def handler(
        self,
        task_type: str,
        *,
        retry_if: Callable[[Exception], object] | None = None,
        backoff: Backoff | None = None,
        timeout: DurationLike | None = None,
        on_failure: str | None = None,
    ) -> Callable[[H], H]:
        """Decorator form of `handle`, with the same keywords."""

        def register(fn: H) -> H:
            self.handle(
                task_type, fn, retry_if=retry_if, backoff=backoff, timeout=timeout, on_failure=on_failure
            )
            return fn

        return register

    def instrument(self, *middleware: Middleware) -> None:
        """Wrap every later handler run in ``middleware`` too, inside ``Config.middleware`` (the
        first given outermost of them): e.g. ``gate.instrument(taskgate.metrics.Prometheus())``.

        An instrument (a `taskgate.metrics.Prometheus`) is also told of this gate's submits and
        outcomes from now on; installing one twice changes nothing more. Raises `ConfigError`
        naming one that is not a coroutine function, having installed none.
        """
        self._runtime.instrument(check_middleware(middleware, where="Gate.instrument"))

    def schedule(
        self,
        name: str,
        cron: str,
        type: str,
        payload: Any = None,
        *,
        timezone: str = "UTC",
        catch_up: bool = False,
        **submit_options: Any,
    ) -> Schedule:
        """Submit a ``type`` task with ``payload`` at every tick of ``cron`` while this gate runs
        (from now, when it runs already); the `Schedule` made.

        The arguments are `Schedule`'s: ``cron`` in 5 fields, or 6 with seconds first, read in
        ``timezone``; each tick's task has the business key ``schedule:<name>:<tick UTC ISO>``,
        so one task per tick exists however many gates tick it. After downtime ``catch_up=False``
        submits the latest missed tick, ``True`` each (`taskgate.runtime.ticker`).
        ``submit_options`` are `submit`'s but ``business_key``, ``run_at`` and ``delay``.
        Raises `ConfigError` naming a bad expression, time zone, option, a type without a queue
        or a name scheduled already, registering nothing.
        """
        schedule = Schedule(name, cron, type, payload, timezone=timezone, catch_up=catch_up, **submit_options)
        self._ticker.add(schedule)
        self._runtime.start_ticker()
        return schedule

    # -- submitting ------------------------------------------------------------------------------

    async def submit(
        self,
        type: str,
        payload: Any = None,
        *,
        business_key: str | None = None,
        delay: DurationLike | None = None,
        run_at: datetime | None = None,
        max_retry: int | None = None,
        depends_on: Iterable[str] = (),
        ignore_parent_failure: bool = False,
        timeout: DurationLike | None = None,  # noqa: ASYNC109 (SPEC name: the task's run-time limit)
        group: str | None = None,
        priority: int = 0,
    ) -> str:
        """Queue one task and return its execution id (a ULID).

        ``run_at`` wins over ``delay`` (timedelta, seconds or "10s"); ``max_retry`` defaults to
        ``Config.max_retry``. ``timeout`` (> 0, a duration like ``delay``) limits each run of
        the task, instead of its queue's ``QueueConfig.timeout``: a run past it is cancelled
        and counts as a business failure (``TimeoutError``). ``group`` puts the task in a group
        of its queue (a tenant, a user) limited by the queue's ``group_*`` limits. ``priority``
        (an int within 32 bits): among the queue's due tasks a higher one is claimed first, then
        the earlier due, then the smaller id -- a steady stream of higher ones can starve lower
        ones. Raises `ShutdownError`,
        `TaskNotFoundError` (unknown parent), `TaskExistsError` (used business key), or
        `TypeError`/`ValueError` naming a bad argument. When the queue is at its
        ``QueueConfig.max_pending``, waits for room (``on_full="block"``; bound it with a
        cancel scope, e.g. ``anyio.fail_after``: nothing is stored then) or raises
        `QueueFullError` (``on_full="raise"``).
        """
        ids = await self._submit(
            type,
            [payload],
            business_key=business_key,
            delay=delay,
            run_at=run_at,
            max_retry=max_retry,
            depends_on=depends_on,
            ignore_parent_failure=ignore_parent_failure,
            timeout=timeout,
            group=group,
            priority=priority,
        )
        return ids[0]

    async def submit_many(
        self,
        type: str,
        payloads: Iterable[Any],
        *,
        business_keys: Iterable[str | None] | None = None,
        delay: DurationLike | None = None,
        run_at: datetime | None = None,
        max_retry: int | None = None,
        depends_on: Iterable[str] = (),
        ignore_parent_failure: bool = False,
        timeout: DurationLike | None = None,  # noqa: ASYNC109 (SPEC name: the task's run-time limit)
        group: str | None = None,
        priority: int = 0,
    ) -> builtins.list[str]:
        """Queue one task per payload in one all-or-nothing batch (one broker call); ids in payload order.

        Takes `submit`'s options; instead of ``business_key``, ``business_keys`` gives one key
        (or None) per payload. A used key raises `TaskExistsError` and stores none of the batch;
        a key given twice or a key count unlike the payload count raises `ValueError`.
        Back-pressure as for `submit`, for the whole batch: one larger than the queue's
        ``max_pending`` can never fit and raises `QueueFullError` at once, even with
        ``on_full="block"``.
        """
        if isinstance(payloads, str | bytes):
            raise TypeError("payloads must be an iterable of payloads, not a single str/bytes")
        return await self._submit(
            type,
            payloads,
            business_keys=business_keys,
            delay=delay,
            run_at=run_at,
            max_retry=max_retry,
            depends_on=depends_on,
            ignore_parent_failure=ignore_parent_failure,
            timeout=timeout,
            group=group,
            priority=priority,
        )

    def enqueue_in(
        self, session_or_connection: Any, type: str, payload: Any = None, **submit_options: Any
    ) -> str:
        """Write one task in the application's own transaction; its execution id. Not async.

        ``session_or_connection`` is a SQLAlchemy `Session` or `Connection` on the broker's
        database: the task is committed by the application's commit and gone with its
        rollback. Workers in this process hear of it once the session commits; on PostgreSQL
        others are notified in the same transaction; elsewhere they find it by polling. From
        an ``AsyncSession``: ``await session.run_sync(lambda s: gate.enqueue_in(s, ...))``.
        ``submit_options`` are `submit`'s. Raises `ConfigError` for a broker that is not SQL
        or a session bound to another database, and `submit`'s errors, having written nothing.
        A queue with ``max_pending`` is counted in the transaction, whose lock on the queue's
        count is then held until the application commits; when it is full `QueueFullError` is
        raised whatever its ``on_full`` (it never waits inside the application's transaction).
        """
        self._runtime.check_open()
        broker = in_transaction_broker(self.config.broker)
        (task,) = build_tasks(self.config, type, [payload], **submit_options)
        limits, _ = limits_of(self.config, task.queue)
        return enqueue_in(broker, session_or_connection, task, max_pending=limits)

    async def _submit(self, task_type: str, payloads: Iterable[Any], **options: Any) -> builtins.list[str]:
        self._runtime.check_open()
        tracing = self._runtime.tracing
        if tracing is None or not tracing.active:  # no span to open: the submit's hot path
            return await self._store(build_tasks(self.config, task_type, payloads, **options))
        with tracing.submitting(task_type) as span:
            tasks = build_tasks(self.config, task_type, payloads, trace_context=span.trace_context, **options)
            ids = await self._store(tasks)
            span.stored(tasks)
            return ids

    async def _store(self, tasks: builtins.list[NewTask]) -> builtins.list[str]:
        return await self._runtime.submit(tasks) if tasks else []

    # -- reading ---------------------------------------------------------------------------------

    async def get(self, id: str) -> Task:
        """The current snapshot of execution ``id``; `TaskNotFoundError` when there is none."""
        check_identifier(id, what="execution id")
        return await self._runtime.calls(self.config.broker.get, id)

    async def list(self, filter: Filter | None = None, **filter_fields: Any) -> builtins.list[Task]:
        """Tasks matching ``filter`` (fields may also be given as keywords, overriding it).

        Sorted by ``(created_at, id)``, then ``offset`` skipped and ``limit`` taken (0 = all).
        """
        return await self._list(_filter(filter, filter_fields))

    async def _list(self, query: Filter) -> builtins.list[Task]:
        return await self._runtime.calls(self.config.broker.list, query)

    async def _list_in(self, query: Filter, statuses: Iterable[Status]) -> builtins.list[Task]:
        """The tasks ``query`` matches in any of ``statuses``, by ``(created_at, id)``, then
        its offset and limit."""
        found: builtins.list[Task] = []
        for status in statuses:
            found += await self._list(dataclasses.replace(query, status=status, limit=0, offset=0))
        found.sort(key=lambda t: (t.created_at, t.id))
        end = None if query.limit == 0 else query.offset + query.limit
        return found[query.offset : end]

    async def history(self, business_key: str) -> builtins.list[Task]:
        """Every execution of ``business_key``, oldest first (``[]`` for an unknown key)."""
        check_identifier(business_key, what="business_key")
        return await self._runtime.calls(self.config.broker.list, Filter(business_key=business_key))

    async def stats(self, queue: str) -> QueueStats:
        """``queue``'s limits, its handlers running here, and its backlog and quota window as
        the store holds them (the same from any process, one with no workers too).

        Never raises for the store: while it does not answer (within the deadline of a
        worker's broker call, ``lease_ttl/4`` up to 30 s) the last figures this gate read are
        given with ``reachable=False``. Raises `ConfigError` for a queue not configured.
        """
        return await self._stats.read(queue, self._queue_config(queue))

    def _queue_config(self, queue: str) -> QueueConfig:
        conf = self.config.queue_config(check_identifier(queue, what="queue"))
        if conf is None:
            raise ConfigError(f"unknown queue {queue!r}: not in Config.queues and no default_queue")
        return conf

    async def overview(self) -> dict[str, dict[Status, int]]:
        """Task counts by type and status, from the broker's counters."""
        return await self._runtime.calls(self.config.broker.counts)

    async def wait(self, id: str, *, timeout: float | None = None) -> bytes | None:  # noqa: ASYNC109 (SPEC name)
        """The result of ``id`` once completed; `TaskFailedError` when it failed or was canceled.

        Raises `TimeoutError` after ``timeout`` seconds (the task goes on). Tasks finishing
        in this process wake the waiter at once; others are polled every few poll intervals.
        """
        check_identifier(id, what="execution id")
        with anyio.fail_after(timeout):
            while True:
                task = await self._wait_step(id)
                if task is not None:
                    break
        if task.status is Status.COMPLETED:
            return task.result
        raise TaskFailedError(task)

    async def wait_json(self, id: str, *, timeout: float | None = None) -> Any:  # noqa: ASYNC109 (SPEC name)
        """`wait`, with the result decoded from JSON: what the handler returned (None for none).

        A result that is not JSON (a handler that returned bytes of its own) raises `ValueError`
        naming the task; `wait` returns those bytes as they are.
        """
        result = await self.wait(id, timeout=timeout)
        if result is None:
            return None
        try:
            return json.loads(result)
        except ValueError as exc:  # JSONDecodeError, UnicodeDecodeError
            raise ValueError(f"the result of {id} is not JSON ({exc}); wait() returns its bytes") from None

    async def _wait_step(self, task_id: str) -> Task | None:
        waiters = self._runtime.waiters
        event = waiters.add(task_id)
        try:
            task = await self.get(task_id)
            if task.status.is_final:
                return task
            with anyio.move_on_after(max(self._runtime.poll_interval * 2.5, 0.1)):
                await event.wait()
            return None
        finally:
            waiters.discard(task_id, event)

    # -- changing --------------------------------------------------------------------------------

    async def cancel(self, id: str) -> Task:
        """Cancel ``id`` and return its snapshot.

        Waiting tasks are canceled at once with their descendants; a running task is marked and
        its handler cancelled at once here, or within a heartbeat in another process.
        Raises `AlreadyFinalError` on a final task, `TaskNotFoundError` on an unknown id.
        """
        check_identifier(id, what="execution id")
        task = await self._runtime.calls(self.config.broker.cancel, id)
        self._runtime.cancel_local(task)
        await self._runtime.observe([task])
        return task

    async def replay(
        self,
        execution_id: str,
        *,
        allow_completed: bool = False,
        payload: Any | Unset = UNSET,
        descendants: bool = False,
    ) -> str:
        """Re-run a final execution as a new one (``replay_of`` = ``execution_id``); returns its id.

        ``payload`` replaces the old payload when given. ``descendants=True``: the canceled
        descendants of ``execution_id`` (the later stages of a pipeline its failure canceled)
        are re-run too, each depending on the new executions of its parents, all in one unit
        with it -- a failed pipeline recovers in one call. Raises `ReplayNotFinalError`,
        `AlreadyReplayedError` (not the newest of its chain; with ``descendants``, for any of
        them), `CompletedNotAllowedError`, creating nothing.
        """
        self._runtime.check_open()
        check_identifier(execution_id, what="execution id")
        body = payload if isinstance(payload, Unset) else encode_value(payload, what="payload")
        pairs = replay_pairs(await descendants_to_rerun(self._list, execution_id)) if descendants else ()
        replay = Replay(
            execution_id, new_id(), allow_completed=allow_completed, payload=body, descendants=pairs
        )
        return (await self._replay(replay))[0]

    async def _replay(self, replay: Replay) -> builtins.list[str]:
        """Make ``replay``; the ids of the executions it created (its first one first)."""
        task = await self._runtime.calls(self.config.broker.replay, replay)
        made = [task, *[await self.get(new) for _, new in replay.descendants]]
        await self._runtime.observe(made)
        return [t.id for t in made]

    async def cancel_many(self, filter: Filter | None = None, **filter_fields: Any) -> int:
        """Cancel every task ``filter`` matches (fields also as keywords, as for `list`) that is
        not final yet -- blocked, pending, retrying, running (marked) -- as `cancel` does each;
        how many it canceled or marked. Descendants canceled along with a task are not counted;
        a task that finished meanwhile is passed over. ``limit``/``offset`` page the matches.
        """
        query = _filter(filter, filter_fields)
        if query.status is not None and query.status.is_final:
            return 0
        statuses = WAITING_STATUSES if query.status is None else (query.status,)
        canceled = 0
        for task in await self._list_in(query, statuses):
            try:
                await self.cancel(task.id)
            except (AlreadyFinalError, TaskNotFoundError):
                continue  # finished, or canceled with an ancestor, since it was read
            canceled += 1
        return canceled

    async def replay_many(
        self, filter: Filter | None = None, *, allow_completed: bool = False, **filter_fields: Any
    ) -> builtins.list[str]:
        """`replay` every final task ``filter`` matches (fields also as keywords) with its
        canceled descendants (``descendants=True``); the ids of the executions created.

        Without a status in the filter: failed and canceled tasks, and completed ones with
        ``allow_completed``. A task already re-run -- by an earlier replay in this call (a stage
        of a pipeline replayed with its failed stage) or elsewhere (not the newest of its chain)
        -- is passed over. Oldest first; ``limit``/``offset`` page the matches. A status that is
        not final raises `ValueError`, replaying nothing.
        """
        self._runtime.check_open()
        query = _filter(filter, filter_fields)
        statuses = replay_statuses(query, allow_completed)
        made: builtins.list[str] = []
        covered: set[str] = set()
        for task in await self._list_in(query, statuses):
            if task.id in covered:
                continue
            pairs = replay_pairs(await descendants_to_rerun(self._list, task.id))
            replay = Replay(task.id, new_id(), allow_completed=allow_completed, descendants=pairs)
            try:
                made += await self._replay(replay)
            except (AlreadyReplayedError, ReplayNotFinalError, CompletedNotAllowedError, TaskNotFoundError):
                continue  # re-run, or gone, since it was read
            covered.update(old for old, _ in pairs)
        return made

    async def replay_by_key(
        self, business_key: str, *, allow_completed: bool = False, payload: Any | Unset = UNSET
    ) -> str:
        """`replay` the newest execution of ``business_key``; `TaskNotFoundError` for an unknown key."""
        executions = await self.history(business_key)
        if not executions:
            raise TaskNotFoundError(f"no execution has business key {business_key!r}")
        return await self.replay(executions[-1].id, allow_completed=allow_completed, payload=payload)

    async def purge(self, filter: Filter | None = None, *, older_than: DurationLike | None = None) -> int:
        """Delete the final tasks ``filter`` matches (None: every final task) that finished at
        least ``older_than`` ago (None: any time); how many went.

        Never a task that is not final, nor one still needed: a parent of a task still to run,
        an execution whose replay is stored (`Broker.prune`); a business key whose executions
        are all gone is free again. ``filter`` narrows by status (a final one), type, queue and
        group; its ``limit`` caps how many go (0: all). A filter naming a status that is not
        final, a business key or an offset raises `ValueError` before anything is deleted.
        Runs in bounded broker calls: an error midway leaves what went gone.
        """
        prune, limit = purge_params(filter, older_than)
        return await purge(self._runtime.calls, self.config.broker, prune, limit)

    # -- holding ---------------------------------------------------------------------------------

    async def pause(self, queue: str, for_: DurationLike | None = None) -> datetime:
        """Hold ``queue`` in every process sharing the store: none claims from it until ``for_``
        has passed (a duration like `submit`'s ``delay``, > 0) or, with None, until `resume`.

        Handlers already running finish. A longer hold already set -- a longer pause, a
        queue-wide `Throttled` -- is kept; `resume` ends any hold. Returns when the hold ends,
        on the store's clock (``datetime.max`` in UTC: until resumed), as
        ``QueueStats.paused_until`` reads it. Raises `ConfigError` for a queue not configured,
        `TypeError`/`ValueError` naming a bad ``for_``, having changed nothing.
        """
        self._queue_config(queue)
        wait = pause_for(for_)
        held = await self._runtime.calls(self.config.broker.hold, Hold(queue, for_=wait))
        self._runtime.hold_here(queue, None if wait is None else wait.total_seconds())
        assert held is not None, "a broker answers a queue it just held as held"
        return held

    async def resume(self, queue: str) -> None:
        """End ``queue``'s hold -- a pause, or a queue-wide `Throttled` -- so every process
        claims from it again (another within one poll interval). Resuming a queue that is not
        held changes nothing. Raises `ConfigError` for a queue not configured.
        """
        self._queue_config(queue)
        await self._runtime.calls(self.config.broker.hold, Hold(queue, resume=True))
        self._runtime.resume_here(queue)

    # -- running ---------------------------------------------------------------------------------

    async def run(
        self,
        *,
        queues: Iterable[str] | None = None,
        task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED,
    ) -> None:
        """Claim and execute the queues of the registered types until `shutdown` or cancellation.

        ``queues``: claim from these only (a worker deployment per queue); each must be
        configured, else `ConfigError` naming it, before anything runs. Returns after
        in-flight work has ended. Works with ``TaskGroup.start``.
        """
        only = None
        if queues is not None:
            if isinstance(queues, str):
                raise TypeError(f"queues takes a collection of queue names, not the string {queues!r}")
            only = frozenset(queues)
            for name in sorted(only):
                self._queue_config(name)
        await self._runtime.run(queues=only, task_status=task_status)

    async def shutdown(self, timeout: float | None = None) -> None:  # noqa: ASYNC109 (SPEC name)
        """Stop claiming and let running handlers finish; after ``timeout`` seconds cancel them.

        Cancelled handlers' tasks go back to pending exactly as they were (no counter moves).
        Later submits raise `ShutdownError`. Returns when the workers have stopped.
        """
        if timeout is not None:
            _check_positive("timeout", timeout, allow_zero=True)
        await self._runtime.shutdown(timeout)

    async def __aenter__(self) -> Gate:
        """Start `run` in the background; the block's end shuts down gracefully."""
        group = anyio.create_task_group()
        await group.__aenter__()
        try:
            await group.start(self.run)
        except BaseException as exc:
            await group.__aexit__(type(exc), exc, exc.__traceback__)
            raise
        self._task_group = group
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> bool | None:
        """Shut down (waiting for running handlers) and leave the background task group."""
        group, self._task_group = self._task_group, None
        with anyio.CancelScope(shield=exc_type is not None):
            await self.shutdown()
        if group is not None:
            return await group.__aexit__(exc_type, exc, tb)
        return None


def _check_positive(name: str, value: object, *, allow_zero: bool = False) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"{name} must be a number of seconds, got {value!r}")
    if value < 0 or (value == 0 and not allow_zero):
        raise ValueError(f"{name} must be {'>= 0' if allow_zero else '> 0'} seconds, got {value!r}")


def _check_broker(config: Config) -> None:
    """Broker-dependent config checks: declared capabilities must cover what the config needs."""
    caps = getattr(config.broker, "capabilities", None)
    if not isinstance(caps, Capabilities):
        raise ConfigError(f"Config.broker must declare `capabilities` (a Capabilities), got {caps!r}")
    if not caps.shared_quota:
        for name, queue in config.queues.items():
            if queue.has_quota:
                raise ConfigError(
                    f"Config.queues[{name!r}].quota_limit={queue.quota_limit}: broker "
                    f"{type(config.broker).__name__} cannot share quota counts (capabilities.shared_quota)"
                )
        default = config.default_queue
        if default is not None and default.has_quota:
            raise ConfigError(
                f"Config.default_queue.quota_limit={default.quota_limit}: broker cannot share quota counts"
            )
    if not (caps.shared_limits and caps.group_limits):
        queues = [
            *config.queues.items(),
            *([("default", config.default_queue)] if config.default_queue else []),
        ]
        for name, queue in queues:
            if queue.has_group_limits:
                raise ConfigError(
                    f"queue {name!r} sets group limits: broker {type(config.broker).__name__} cannot "
                    "count groups across processes (capabilities.group_limits)"
                )
    if config.on_state_change is not None and not callable(getattr(config.broker, "report_settled", None)):
        raise ConfigError(
            f"broker {type(config.broker).__name__} has no report_settled(sink): an on_state_change "
            "hook needs it to see the tasks transitions settle on their own (children woken, "
            "descendants canceled)"
        )
    if caps.split_calls and not isinstance(config.broker, SplitCaller):
        raise ConfigError(
            f"broker {type(config.broker).__name__} declares capabilities.split_calls but has no "
            "split() (taskgate.brokers.split.SplitCaller)"
        )


def _filter(filter: Filter | None, fields: dict[str, Any]) -> Filter:
    """``filter`` (None: match all) with ``fields`` overriding it; `TypeError` naming unknowns."""
    base = filter if filter is not None else Filter()
    if not isinstance(base, Filter):
        raise TypeError(f"filter must be a taskgate.Filter, got {type(base).__name__}")
    known = {f.name for f in dataclasses.fields(Filter)}
    unknown = sorted(set(fields) - known)
    if unknown:
        raise TypeError(f"unknown filter field(s) {', '.join(unknown)}; known: {sorted(known)}")
    return dataclasses.replace(base, **fields) if fields else base
