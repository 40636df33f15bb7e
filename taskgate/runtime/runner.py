"""The runtime behind `Gate`: schedulers, executor, reaper, wake-ups and hooks, started by `run`.

Layout of `Runtime.run` (outer to inner task groups): background (hook consumer, reaper,
cross-process wake-ups) -> work (one scheduler per queue, each with its ack writer and its
``workers`` long-lived worker tasks; the schedules' `Ticker`).
Shutdown stops the schedulers and the ticker first, lets the work group drain (cancelling and requeueing on
timeout), then stops the background loops and lets the hook consumer deliver what is queued.
"""

from __future__ import annotations

import functools
import logging
import time
from collections import deque
from collections.abc import Iterable, Mapping, MutableMapping, Sequence
from datetime import timedelta
from typing import cast

import anyio
from anyio.abc import TaskStatus

from taskgate.brokers.base import Lease, NewTask, QuotaGrant
from taskgate.brokers.params import Compensation, Submit, Submitted
from taskgate.brokers.split import SplitCaller
from taskgate.config import Config, QueueConfig
from taskgate.errors import BrokerError, ShutdownError
from taskgate.middleware import Middleware
from taskgate.runtime.acks import AckWriter
from taskgate.runtime.backpressure import PendingLimits, Room, limits_of, store_when_room
from taskgate.runtime.calls import BrokerCalls
from taskgate.runtime.context import Lane, RunContext
from taskgate.runtime.executor import Executor, Handler
from taskgate.runtime.hooks import HookDispatcher
from taskgate.runtime.lease import LeaseKeeper
from taskgate.runtime.limits import Limits, LocalLimits, SharedQueueLimits, Slot
from taskgate.runtime.observers import Observer, Observers
from taskgate.runtime.outcome import DEFAULT_BACKOFF, DEFAULT_POLICY, HandlerPolicy, Policy, StopReason
from taskgate.runtime.quota import QuotaGate
from taskgate.runtime.retention import prune_pass, retention_plan
from taskgate.runtime.scheduler import QueueScheduler
from taskgate.runtime.signals import Signal, TaskWaiters
from taskgate.runtime.ticker import Ticker
from taskgate.runtime.tracing import load_tracing
from taskgate.runtime.wakeups import reap_forever, wait_for_work_forever
from taskgate.task import Status, Task

__all__ = ["Runtime", "worker_deadline"]

log = logging.getLogger("taskgate")

MIN_BROKER_THREADS = 8


def worker_deadline(conf: QueueConfig) -> float:
    """The deadline of a worker-path broker call of a queue: shorter than ``lease_ttl/3``."""
    return min(conf.lease.total_seconds() / 4, 30.0)


class Runtime:
    """Owns everything that runs; `Gate` is its public face."""

    def __init__(
        self,
        config: Config,
        handlers: MutableMapping[str, Handler],
        *,
        poll_interval: float,
        reap_interval: float | None,
        policies: Mapping[str, HandlerPolicy] | None = None,
    ) -> None:
        """``policies``: the retry policy a handler was registered with, by task type."""
        self.config, self.broker, self.handlers = config, config.broker, handlers
        self._only: frozenset[str] | None = None  # the queues `run` claims from (None: all handled)
        self.policies: Mapping[str, HandlerPolicy] = policies if policies is not None else {}
        self.poll_interval = poll_interval
        self._reap_interval = reap_interval
        self.waiters = TaskWaiters()
        self.hooks = HookDispatcher(config.on_state_change)
        # What broker calls settled on their own (a child woken, descendants canceled), handed
        # over by the broker in whichever thread made the call; `observe` passes it on. Asked
        # for only with a hook: nothing else looks at those tasks.
        self._also_settled: deque[Task] = deque()
        if self.hooks.hook is not None:
            self.broker.report_settled(self._also_settled.extend)
        # Fixed here, as the hook is: without one, nothing reads a submitted task's snapshot.
        self._submit_snapshots = self.hooks.hook is not None
        self.schedulers: dict[str, QueueScheduler] = {}
        self.queue_idle = Signal()  # a scheduler's claim came back short, or a queue was added
        # Running contexts by (task id, claims): a reaped claim may still be running here when
        # the task it lost has already been claimed and run again in this process.
        self.active: dict[tuple[str, int], RunContext] = {}
        self.keeper = LeaseKeeper()
        self.closing = False
        self._calls: BrokerCalls | None = None
        self._threads: anyio.CapacityLimiter | None = None
        self._running = False
        self._stopped: anyio.Event | None = None
        self._work_done: anyio.Event | None = None
        # Shutdown's grace has run out: anything still running (or starting) is put back.
        self._grace_over = False
        self._work_group: anyio.abc.TaskGroup | None = None
        self._executor_ref: Executor | None = None
        self._retention = retention_plan(config)
        # Config.middleware, and what `Gate.instrument` adds: the executor reads it at each run.
        self.middleware: list[Middleware] = []
        self.observers = Observers()
        self.tracing = load_tracing()  # None without opentelemetry installed
        # Back-pressure: each queue's `Submit.max_pending`, and the room blocked submits wait for.
        self._max_pending: dict[str, tuple[PendingLimits, bool]] = {}
        self.room = Room()
        self.instrument(config.middleware)
        self.ticker: Ticker | None = None  # the gate's schedules (set by `Gate`), ticked by `run`

    def instrument(self, middleware: Sequence[Middleware]) -> None:
        """Wrap every later handler run in ``middleware`` too (inside what is there already);
        each that is an `Observer` is bound here and told of this runtime's events."""
        for item in middleware:
            if isinstance(item, Observer):
                if any(known is item for known in self.observers.items):
                    continue
                self.observers.add(item, self)
            self.middleware.append(item)

    # -- resources ---------------------------------------------------------------------------

    @property
    def calls(self) -> BrokerCalls:
        """The broker door; created on first use inside the event loop."""
        if self._calls is None:
            workers = sum(q.workers for q in self._all_queue_configs())
            self._calls = BrokerCalls(
                max(MIN_BROKER_THREADS, workers + len(self.config.queues) + 4),
                inline=self.broker.capabilities.nonblocking,
                attempt_inline=self.broker.capabilities.inline_attempts,
                split=cast(SplitCaller, self.broker).split if self.broker.capabilities.split_calls else None,
                on_error=self.observers.broker_failed,
            )
        return self._calls

    def _thread_limiter(self) -> anyio.CapacityLimiter:
        if self._threads is None:
            self._threads = anyio.CapacityLimiter(max(1, sum(q.workers for q in self._all_queue_configs())))
        return self._threads

    def _all_queue_configs(self) -> list[QueueConfig]:
        confs = [self.config.queue_config(self.config.queue_for(t)) for t in self.handlers]
        return [*self.config.queues.values(), *(c for c in confs if c is not None)]

    @property
    def is_running(self) -> bool:
        """`run` is under way (from its start until it has returned)."""
        return self._running

    def check_open(self) -> None:
        """Raise `ShutdownError` once shutdown has begun."""
        if self.closing:
            raise ShutdownError("the gate is shut down; no new tasks are accepted")

    # -- submitting -----------------------------------------------------------------------------

    async def submit(self, tasks: list[NewTask]) -> list[str]:
        """Store ``tasks`` and react to what they became (`observe`); their ids, in order.

        A task due at once wakes its queue's scheduler here, which claims it without waiting
        for the poll (`wake_queue`). Without a hook the broker answers statuses instead of
        snapshots (`arrived_unseen`).
        """
        queue = tasks[0].queue  # a gate's submit is of one type: one queue
        known = self._max_pending.get(queue)
        if known is None:
            known = self._max_pending[queue] = limits_of(self.config, queue)
        limits, block = known
        submit = Submit(tuple(tasks), snapshots=self._submit_snapshots, max_pending=limits)
        if limits:
            submitted = await store_when_room(
                self._store, submit, block=block, room=self.room, check_open=self.check_open
            )
        elif self.observers:
            submitted = await self._store(submit)
        else:  # the hot path: no limit, nobody timing it
            submitted = await self.calls(self.broker.submit, submit)
        if submit.snapshots:
            await self.observe(submitted.tasks)
        else:
            self.arrived_unseen(tasks, submitted.statuses)
        return [task.id for task in tasks]

    async def _store(self, submit: Submit) -> Submitted:
        if not self.observers:
            return await self.calls(self.broker.submit, submit)
        began = time.perf_counter()
        submitted = await self.calls(self.broker.submit, submit)
        self.observers.submitted(submit.tasks, time.perf_counter() - began)
        return submitted

    # -- observing transitions ------------------------------------------------------------------

    async def observe(self, tasks: Iterable[Task]) -> None:
        """React to snapshots this process produced: hooks, waiters, wake-ups. The tasks broker
        calls settled on their own meanwhile come first: each was reported before its call
        answered, so before anything a later call did to the same task (a woken child's
        ``pending`` goes before its ``running`` or ``completed``)."""
        tasks = [*self._take_also_settled(), *tasks]
        cascade = False
        for task in tasks:
            if task.status.is_final:
                self.waiters.notify(task.id)
                self.room.freed(task.queue)  # a waiting task canceled makes room
                cascade = cascade or task.status is not Status.COMPLETED
            elif task.status in (Status.PENDING, Status.RETRYING):
                self.wake_queue(task.queue)
        if cascade:
            self.waiters.notify_all()  # descendants were canceled in the same transition
        if any(t.status.is_final for t in tasks):
            self.wake_all()  # children may have become pending in any queue
        await self.hooks.emit(tasks)

    def _take_also_settled(self) -> list[Task]:
        """Everything brokers reported settled since the last look (see `observe`)."""
        taken: list[Task] = []
        settled = self._also_settled
        while settled:  # the event loop alone takes; broker threads only add
            taken.append(settled.popleft())
        return taken

    def arrived_unseen(self, tasks: Sequence[NewTask], statuses: Sequence[Status]) -> None:
        """`observe` for tasks this process stored without reading them back (no hook is set,
        so only the schedulers of their queues and the waiters of tasks canceled on arrival
        need to know)."""
        woken: set[str] = set()
        for task, status in zip(tasks, statuses, strict=True):
            if status in (Status.PENDING, Status.RETRYING):
                if task.queue not in woken:
                    woken.add(task.queue)
                    self.wake_queue(task.queue)
            elif status.is_final:
                # Canceled on arrival (a parent failed): its own status is all there is to
                # tell; a new task has no descendants outside its batch to cascade to.
                self.waiters.notify(task.id)

    def completed_unseen(self, task_ids: Sequence[str]) -> None:
        """`observe` for tasks this process completed without reading them back (no hook is
        set, so only the waiters and the schedulers need to know)."""
        if self.waiters:
            for task_id in task_ids:
                self.waiters.notify(task_id)
        if task_ids:
            self.wake_all()  # children may have become pending in any queue

    def wake_queue(self, queue: str) -> None:
        """Wake ``queue``'s scheduler, if this process runs it."""
        scheduler = self.schedulers.get(queue)
        if scheduler is not None:
            scheduler.wake()

    def hold_here(self, queue: str, seconds: float | None) -> None:
        """Start nothing more of ``queue`` in this process for ``seconds`` (None: until the
        store says it is no longer held), at once, while the hold is written to the store."""
        scheduler = self.schedulers.get(queue)
        if scheduler is not None:
            scheduler.hold_here(seconds)

    def resume_here(self, queue: str) -> None:
        """``queue`` was resumed: its scheduler claims again now."""
        scheduler = self.schedulers.get(queue)
        if scheduler is not None:
            scheduler.resume_here()

    def wake_all(self, *, new_work: bool = False) -> None:
        """Wake every scheduler: work was queued elsewhere (``new_work``) or children may be due."""
        for scheduler in self.schedulers.values():
            scheduler.wake(new_work=new_work)

    # -- run / shutdown ------------------------------------------------------------------------

    async def run(
        self,
        *,
        queues: frozenset[str] | None = None,
        task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED,
    ) -> None:
        """Claim and execute the handled queues (of ``queues`` only, when given) until
        `shutdown` or cancellation."""
        self.check_open()
        if self._running:
            raise RuntimeError("this gate is already running")
        self._only = queues
        self._running = True
        self._stopped, self._work_done = anyio.Event(), anyio.Event()
        self._grace_over = False
        try:
            await self._run(task_status)
        finally:
            self._running = False
            self.schedulers = {}
            self._work_group = self._executor_ref = None
            # Also when cancelled: a `shutdown` waiting for the work to finish gracefully must
            # not wait for tasks that the same cancellation ended (a gate block past its deadline).
            self._work_done.set()
            self._stopped.set()

    async def _run(self, task_status: TaskStatus[None]) -> None:
        executor = self._executor()
        async with anyio.create_task_group() as background:
            await background.start(self.hooks.run)
            loops = anyio.CancelScope()
            background.start_soon(self._background_loops, loops)
            try:
                async with anyio.create_task_group() as work:
                    self._start_schedulers(work, executor, task_status)
                assert self._work_done is not None
                self._work_done.set()
            finally:
                loops.cancel()
                self.hooks.close()

    def _start_schedulers(
        self, work: anyio.abc.TaskGroup, executor: Executor, status: TaskStatus[None]
    ) -> None:
        for name in sorted({self.config.queue_for(t) for t in self.handlers}):
            if self._only is None or name in self._only:
                self._add_scheduler(work, executor, name)
        self._work_group, self._executor_ref = work, executor
        self.start_ticker()
        status.started()

    def _add_scheduler(self, work: anyio.abc.TaskGroup, executor: Executor, name: str) -> None:
        conf = self.config.queue_config(name)
        assert conf is not None, f"queue {name!r} has no configuration"
        acks = AckWriter(
            self.broker,
            self.calls,
            deadline=worker_deadline(conf),
            on_settled=self.observe,
            # Without a hook nothing reads a completed task's snapshot: the broker may skip it.
            on_completed=self.completed_unseen if self.hooks.hook is None else None,
            compensations=self.compensations,
        )
        scheduler = QueueScheduler(
            name,
            conf,
            broker=self.broker,
            calls=self.calls,
            limits=self._limits(name, conf),
            quota=self._quota(name, conf),
            poll_interval=self.poll_interval,
            deadline=worker_deadline(conf),
            acks=acks,
            on_requeued=self.observe,  # canceled instead, when a cancel was asked: with cascade
            types=self.handled_types(name),
        )
        acks.on_written = lambda: scheduler.wake(new_work=False)  # a backlog may have held claims
        scheduler.on_idle = self.queue_idle.fire
        scheduler.on_claimed = functools.partial(self.room.freed, name)  # room for blocked submits
        self.schedulers[name] = scheduler
        self.queue_idle.fire()

        # A partial, not a coroutine function: one coroutine frame less per task run.
        start = functools.partial(self._execute, executor, scheduler)
        work.start_soon(scheduler.run, start)

    def handled_types(self, queue: str) -> tuple[str, ...]:
        """The types with a handler here whose tasks go to ``queue``, sorted (`Claim.types`)."""
        return tuple(sorted(t for t in self.handlers if self.config.queue_for(t) == queue))

    def add_queue_for(self, task_type: str) -> None:
        """Claim tasks of a type registered while running: start its queue's scheduler, or
        add the type to the one running (no-op when not running)."""
        name = self.config.queue_for(task_type)
        work, executor = self._work_group, self._executor_ref
        if not self._running or work is None or executor is None or self.closing:
            return
        if self._only is not None and name not in self._only:
            return
        scheduler = self.schedulers.get(name)
        if scheduler is None:
            self._add_scheduler(work, executor, name)
        else:
            scheduler.handle_types(self.handled_types(name))

    def start_ticker(self) -> None:
        """Tick the schedules while running (in the work group: a gate with schedules and no
        handlers runs until shut down); no-op when not running or nothing is scheduled."""
        work = self._work_group
        if self.ticker is not None and self._running and work is not None and not self.closing:
            self.ticker.start(work, self.poll_interval)

    async def _background_loops(self, scope: anyio.CancelScope) -> None:
        with scope:
            async with anyio.create_task_group() as tg:
                tg.start_soon(self.keeper.run)
                tg.start_soon(reap_forever, self, self._reap_every())
                if self.broker.capabilities.cross_process:
                    tg.start_soon(wait_for_work_forever, self, self.poll_interval)

    def _reap_every(self) -> float:
        if self._reap_interval is not None:
            return self._reap_interval
        ttls = [c.lease.total_seconds() for c in self._all_queue_configs()] or [60.0]
        return max(0.01, min(ttls) / 2)

    async def shutdown(self, grace: float | None) -> None:
        """Stop claiming, drain running handlers, requeue the rest after ``grace`` seconds."""
        self.closing = True
        if not self._running or self._stopped is None or self._work_done is None:
            return
        for scheduler in self.schedulers.values():
            scheduler.stop()
        if self.ticker is not None:
            self.ticker.stop()
        with anyio.move_on_after(grace):
            await self._work_done.wait()
        self._grace_over = True
        for ctx in list(self.active.values()):
            ctx.stop(StopReason.SHUTDOWN)
        await self._stopped.wait()

    # -- pieces -------------------------------------------------------------------------------

    def _executor(self) -> Executor:
        return Executor(
            self.broker,
            self.calls,
            self.handlers,
            throttled_max=self.config.throttled_max,
            thread_limiter=self._thread_limiter(),
            on_settled=lambda task: self.observe([task]),
            keeper=self.keeper,
            on_hold=self.hold_here,
            policy_for=self.policy_for,
            compensation_for=self.compensation_for,
            middleware=self.middleware,
            observers=self.observers,
            tracing=self.tracing,
        )

    def run_limit(self, task: Task, conf: QueueConfig) -> timedelta | None:
        """How long a run of ``task`` may take: its own ``timeout``, else its handler's, else
        its queue's (None: no limit)."""
        if task.timeout is not None:
            return task.timeout
        own = self.policies.get(task.type)
        if own is not None and own.timeout is not None:
            return own.timeout
        return conf.run_limit

    def compensation_for(self, task_type: str) -> Compensation | None:
        """What the final failure of a task of ``task_type`` submits (`Gate.handle`'s
        ``on_failure``); None: nothing."""
        own = self.policies.get(task_type)
        return own.compensation if own is not None else None

    def compensations(self) -> dict[str, Compensation]:
        """Every registered type's compensation, for the reaper's failures."""
        return {t: p.compensation for t, p in self.policies.items() if p.compensation is not None}

    def policy_for(self, task: Task) -> Policy:
        """The retry policy of ``task``: its handler's ``retry_if``, and its handler's backoff,
        else its queue's (`QueueConfig.backoff`), else the default."""
        own = self.policies.get(task.type)
        conf = self.config.queue_config(task.queue)
        backoff = (own.backoff if own is not None else None) or (conf.backoff if conf is not None else None)
        retry_if = own.retry_if if own is not None else None
        if backoff is None and retry_if is None:
            return DEFAULT_POLICY
        return Policy(backoff or DEFAULT_BACKOFF, retry_if)

    def _limits(self, name: str, conf: QueueConfig) -> Limits:
        if conf.shared_limits and self.broker.capabilities.shared_limits:
            return SharedQueueLimits(self.broker, self.calls, name, conf, worker_deadline(conf))
        return LocalLimits(conf)

    def _quota(self, name: str, conf: QueueConfig) -> QuotaGate | None:
        key = self.config.quota_key(name)
        if key is None or conf.period is None:
            return None
        return QuotaGate(
            key=key, limit=conf.quota_limit, period=conf.period, recheck=max(self.poll_interval * 5, 0.05)
        )

    async def _execute(
        self,
        executor: Executor,
        scheduler: QueueScheduler,
        lease: Lease,
        slot: Slot,
        claimed_at: float,
        grant: QuotaGrant | None,
        lane: Lane,
    ) -> None:
        conf = scheduler.conf
        if self._grace_over or scheduler.held:
            # Claimed after shutdown's grace ran out, or just before a queue-wide throttle of
            # this process: its handler will not start, so the lease goes back as if never
            # claimed, its quota unit (from ``grant``) and slot with it.
            scheduler.running -= 1
            with anyio.CancelScope(shield=True):
                await scheduler.put_back([(lease, grant)])
            return

        def free_slot() -> None:
            scheduler.running -= 1
            if slot is not None:
                scheduler.limits.give_back(slot)  # goes back with the next claim
            scheduler.wake(new_work=False)

        ctx = RunContext(
            lease=lease,
            broker=self.broker,
            calls=self.calls,
            ttl=conf.lease,
            deadline=scheduler.deadline,
            slot_queue=scheduler.name if slot is not None else None,
            ack=scheduler.acks.put,
            lease_deadline=claimed_at + scheduler.lease_seconds,
            timeout=self.run_limit(lease.task, conf),
            free_slot=free_slot,
        )
        key = (lease.task.id, lease.task.claims)
        self.active[key] = ctx
        try:
            if self.hooks.hook is not None:
                # Running: nothing to wake, only the hook to call -- after what brokers settled
                # before this claim (the task's own wake-up among them, as in `observe`).
                await self.hooks.emit([*self._take_also_settled(), lease.task])
            await executor.run(ctx, lane, auto_heartbeat=not conf.manual_heartbeat)
        finally:
            if self.active.get(key) is ctx:
                del self.active[key]
            ctx.release_slot()  # in case the executor never got that far (once only)

    def cancel_local(self, task: Task) -> None:
        """Cancel the handler of ``task`` at once when it runs in this process."""
        ctx = self.active.get((task.id, task.claims))
        if ctx is not None and task.status is Status.RUNNING:
            ctx.stop(StopReason.CANCELED)

    def lost_leases(self, reaped: Iterable[Task]) -> None:
        """Stop local handlers whose leases the reaper just took back (same claim only)."""
        for task in reaped:
            ctx = self.active.get((task.id, task.claims))
            if ctx is not None:
                ctx.stop(StopReason.LEASE_LOST)

    async def prune_once(self) -> int:
        """One retention pass: delete final tasks past their retention (`retention_plan`);
        how many went. A failure is logged, never raised: the next pass tries again."""
        deadline = min((worker_deadline(c) for c in self._all_queue_configs()), default=15.0)
        try:
            deleted = await prune_pass(self.calls, self.broker, self._retention, deadline)
        except BrokerError as exc:
            log.warning("retention: %s", exc)
            return 0
        except Exception:
            log.exception("retention: pruning final tasks failed")
            return 0
        if deleted:
            log.info("retention deleted %d final task(s)", deleted)
        return deleted

    async def reap_once(self) -> list[Task]:
        """One reaper pass: take back expired leases and react to the result."""
        deadline = min((worker_deadline(c) for c in self._all_queue_configs()), default=15.0)
        try:
            # Passed only when there are some, so a broker written before compensations existed
            # still reaps for gates that use none.
            compensations = self.compensations()
            reap = (
                functools.partial(self.broker.reap, compensations=compensations)
                if compensations
                else self.broker.reap
            )
            reaped = await self.calls(reap, lease_lost_max=self.config.lease_lost_max, deadline=deadline)
        except BrokerError as exc:
            log.warning("reaper: %s", exc)
            return []
        if reaped:
            log.info("reaper took back %d expired lease(s)", len(reaped))
            self.lost_leases(reaped)
            await self.observe(reaped)
        elif self._also_settled:
            await self.observe([])  # settled by a call nothing observed after (a late claim put back)
        return reaped
