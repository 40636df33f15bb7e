"""`SQLBroker`: the broker protocol over SQLite, PostgreSQL and MySQL/MariaDB, written once.

Each verb takes its checked parameter object (`taskgate.brokers.params`) and runs ONE
transaction (`_run`) that calls a transition from the modules named by noun (`create`,
`reads`, `leases`, `batch`, `finish`, `quota_claim`, `quotas`).
`_run` is also where the three cross-cutting concerns live, each once: the retry of
transactions a deadlock or write conflict rolled back (`retry`), the translation of driver
errors into `BrokerError` (`edge`), and the wake-ups announced on commit (`wakeups`).
On PostgreSQL the calls that are one statement can also be sent from the event loop (`split`,
`pg_split`), with the same plan of statement and answer (`tx.OneStatement`) as in `_run`.
"""

from __future__ import annotations

import builtins
import dataclasses
import threading
import time
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from datetime import datetime
from typing import Any, TypeVar, cast

from sqlalchemy import URL, Connection, Engine
from sqlalchemy.pool import QueuePool

from taskgate import forks
from taskgate.brokers import nowait
from taskgate.brokers.base import (
    Capabilities,
    Lease,
    NewTask,
    QuotaGrant,
    QuotaSpec,
    SettledSink,
    Unset,
    check_identifier,
)
from taskgate.brokers.checks import check_count, check_queues, check_timeout
from taskgate.brokers.drivers import missing_driver
from taskgate.brokers.params import (
    Claim,
    Claimed,
    Compensation,
    Complete,
    Finish,
    Heartbeat,
    Hold,
    ItemAnswer,
    Prune,
    QueueQuery,
    QueueState,
    Renewal,
    Replay,
    Settle,
    Step,
    Submit,
    Submitted,
    check_compensations,
)
from taskgate.brokers.split import SplitCall
from taskgate.brokers.sql import (
    batch,
    create,
    finish,
    holds,
    leases,
    outbox,
    quota_claim,
    quotas,
    reads,
    slots,
    steps,
)
from taskgate.brokers.sql import prune as pruning
from taskgate.brokers.sql.dialects import Traits, ValueLimit, traits_for
from taskgate.brokers.sql.edge import translated
from taskgate.brokers.sql.engine import is_memory_sqlite, make_engine, normalize_url, prepare_engine
from taskgate.brokers.sql.held import HeldConnection
from taskgate.brokers.sql.prepared import PreparedCache, preparable, traced
from taskgate.brokers.sql.retry import Conflict, run_with_retries
from taskgate.brokers.sql.rows import snapshot, task_of_plan
from taskgate.brokers.sql.schema import prepare_schema
from taskgate.brokers.sql.serverclock import SampledServerClock
from taskgate.brokers.sql.tx import OneStatement, Tx
from taskgate.brokers.sql.wakeups import Listener, Signals
from taskgate.clock import Clock, utc
from taskgate.errors import BrokerError, ConfigError
from taskgate.models import DEFAULT_PREFIX, check_prefix, models_for
from taskgate.task import STATUS_BY_VALUE, Filter, Status, Task

__all__ = ["INLINE_MAX_ROWS", "SQLBroker"]

_T = TypeVar("_T")

# The largest batch (tasks claimed, acked or enqueued) a transition attempted on an event loop
# may carry; a bigger one would hold the loop for milliseconds and goes to a thread at once.
INLINE_MAX_ROWS = 100


class SQLBroker:
    """Tasks in a SQL database, shared by every process that opens it.

    ``url_or_engine``: a URL (``sqlite:///tasks.db``, ``postgresql://…`` which uses psycopg 3,
    ``mysql://…`` which uses PyMySQL) or an existing `Engine`, whose pool is then shared with
    the application (taskgate's settings go on an option view of it; `close` leaves it open).
    ``table_prefix`` names the tables (an identifier, never interpolated raw into SQL).
    Constructing it never connects: the first call does (for a gate: `async with gate`, or its
    first submit or read), preparing the schema then. ``create_tables=True`` creates missing
    tables on that first use, safely when several processes start at once; ``False`` expects a
    schema migrated with ``taskgate-migrate upgrade``, and the first call raises `SchemaError`
    saying so if it is missing or behind. A URL whose driver is not installed raises
    `ConfigError` naming the extra to install (``pip install 'taskgate[postgresql]'``).
    ``poll_interval`` (seconds) paces `wait_for_work` where no push wake-ups exist.
    ``clock``: when given, every time read or written comes from ``clock.now()`` (tests);
    otherwise from the database server's clock (the host's clock for SQLite), read every few
    seconds and carried forward locally (`taskgate.brokers.sql.serverclock`).

    Connections: those the engine's pool lends (SQLAlchemy's default for a URL: 5, and up to 10
    more for a burst), plus ONE kept checked out beyond the pool for the hottest writes
    (`taskgate.brokers.sql.held`) -- on PostgreSQL two, one in autocommit for its one-statement
    calls and one for its write transactions --, plus on PostgreSQL one listening for wake-ups
    once a worker waits for work. An in-memory SQLite database is one shared connection.
    """

    def __init__(
        self,
        url_or_engine: str | URL | Engine,
        *,
        table_prefix: str = DEFAULT_PREFIX,
        create_tables: bool = True,
        poll_interval: float = 0.2,
        clock: Clock | None = None,
    ) -> None:
        self._models = models_for(check_prefix(table_prefix))
        self._poll = _check_poll_interval(poll_interval)
        self._engine, self._owns_engine, memory = _open_engine(url_or_engine)
        self._reader = self._engine.execution_options(taskgate_read_only=True)
        self._autocommit = self._engine.execution_options(isolation_level="AUTOCOMMIT")
        self._driver = self._engine.dialect.driver
        self._traits: Traits = traits_for(self._engine.dialect.name, self._driver)
        self._prepared = PreparedCache()
        self._clock = clock
        self._server_clock = SampledServerClock(self._traits)
        # One shared connection (in-memory SQLite) must not interleave two transactions.
        self._serial = threading.Lock() if memory else None
        # One writer at a time (SQLite: per file), and a writer that finds the file locked sleeps
        # in busy_timeout's coarse steps (1 ms, 2 ms, 5 ms, ...). This process's own writers
        # (a claim overlapping an ack flush) take turns on a lock instead, at no such cost.
        self._writers = threading.Lock() if self._traits.one_writer and not memory else None
        # The one connection kept checked out beyond the pool (`taskgate.brokers.sql.held`),
        # for the hottest writes: where a claim and a single submit are one statement each
        # (``dml_ctes``: PostgreSQL), those statements in autocommit, with the reads and the
        # split calls; elsewhere the write transactions. Everything else, and a call finding it
        # busy, takes a pooled connection. None for an in-memory SQLite database: its one
        # shared connection is all there is.
        self._held = (
            None
            if memory
            else HeldConnection(self._autocommit, transactions=False)
            if self._traits.dml_ctes
            else HeldConnection(self._engine, transactions=True)
        )
        # PostgreSQL's write transactions (the ack batches) on a second held connection: taking
        # a pooled one per batch cost process.w10 about 13 % there (measured, issue 34).
        self._held_writes = (
            HeldConnection(self._engine, transactions=True) if self._traits.dml_ctes and not memory else None
        )
        self._signals = Signals()
        self._listener: Listener | None = None
        self._listener_lock = threading.Lock()
        self._channel = f"{self._models.prefix}work"
        self._closed = False
        self._sink: SettledSink | None = None
        self.capabilities = Capabilities(
            shared_quota=True,
            shared_limits=True,
            group_limits=True,
            cross_process=not memory,
            push_wakeups=self._traits.push_wakeups,
            in_app_transaction=True,
            # A database in this process: a transition is local work, worth trying on the loop.
            inline_attempts=self._traits.in_process,
            # One writer at a time: an ack write and a claim cannot overlap there, so one
            # transaction for both costs less. A server runs them side by side on two
            # connections, which beat one after the other (PostgreSQL -23 %, MariaDB -10 %
            # `process.w10` when they were joined).
            acks_in_claims=self._traits.one_writer,
            # One statement sent from the event loop on the held connection (`pg_split`).
            split_calls=self._traits.nonblocking_protocol and self._autocommit_held() is not None,
        )
        self._send_split: Callable[..., SplitCall[Any] | None] | None = None
        if self.capabilities.split_calls:
            from taskgate.brokers.sql import pg_split  # psycopg is there: its dialect is in use

            self._send_split = pg_split.send
        # The schema is prepared by the first call (`_ready`), never here: an application
        # importing a module-level broker must not need its database up.
        self._create_tables = create_tables
        self._prepared_schema = False
        self._schema_lock = threading.Lock()
        self._value_limit: ValueLimit | None = None
        forks.register(self)

    def __repr__(self) -> str:
        url = self._engine.url.render_as_string(hide_password=True)
        return f"<SQLBroker {url} prefix={self._models.prefix!r}{' closed' if self._closed else ''}>"

    @property
    def clock(self) -> Clock | None:
        """The clock given at construction; None: the database server's."""
        return self._clock

    def _ready(self) -> ValueLimit | None:
        """Prepare the schema on the first call (again after a failed one); the server's
        largest value (MySQL), for the size checks. Never on an event loop: an attempt there
        (`nowait`) is sent to a thread first."""
        if self._prepared_schema:
            return self._value_limit
        if nowait.active():
            raise nowait.WouldBlock("the schema is not prepared yet")
        with self._schema_lock:
            if self._closed:
                raise BrokerError("SQLBroker is closed")
            if not self._prepared_schema:
                self._value_limit = self._setup(self._create_tables)
                self._prepared_schema = True
        return self._value_limit

    def _setup(self, create_tables: bool) -> ValueLimit | None:
        with translated("preparing the taskgate schema"):
            run_with_retries(
                lambda: prepare_schema(self._engine, self._models, self._traits, create=create_tables),
                self._traits.is_retryable,
            )
            with self._engine.connect() as conn:
                return self._traits.value_limit(conn)

    # -- tasks: create ---------------------------------------------------------------------

    def submit(self, submit: Submit) -> Submitted:
        """Store ``submit.tasks`` all-or-nothing: each task's status on arrival and (unless
        ``submit.snapshots`` is False, which builds none) its snapshot, in the same order.

        Besides the protocol's errors: an id already in use, two tasks of the batch with one
        id or one business key, or a payload larger than the server accepts raise `ValueError`.
        """
        return _submitted(self._store_new(submit), submit.snapshots)

    def _store_new(self, submit: Submit) -> builtins.list[dict[str, Any]]:
        """`submit`'s writes: the rows stored, in order."""
        items = submit.tasks
        self._check_payloads(items)
        if not items:
            return []
        room = submit if submit.max_pending else None
        if len(items) == 1 and room is None:  # a limited queue is counted in a transaction
            stored = self._store_alone(items[0])
            if stored is not None:
                return [stored]
        attempts = 0

        def step(tx: Tx) -> builtins.list[dict[str, Any]]:
            # The first attempt leaves taken ids to the primary key; a re-run checks them.
            nonlocal attempts
            attempts += 1
            return create.store_new(tx, items, check_ids=attempts > 1, room=room)

        return self._run("submit", step, inline=len(items) <= INLINE_MAX_ROWS)

    def submit_in(self, connection: Connection, submit: Submit) -> Submitted:
        """Store ``submit.tasks`` through the application's ``connection``, in the transaction it
        has open (`taskgate.brokers.outbox.InTransaction`); committing is the application's.

        Statements go through SQLAlchemy's execution on that connection (nothing prepared), and
        on PostgreSQL a ``pg_notify`` delivered only if it commits. Raises `ConfigError` for a
        connection on another database (nothing written), and `submit`'s errors.
        """
        if self._closed:
            raise BrokerError("SQLBroker is closed")
        outbox.check_same_database(self._engine, connection.engine)
        self._check_payloads(submit.tasks)
        # The application's driver may not be ours (aiomysql under an AsyncSession): its traits.
        dialect = connection.dialect
        traits = traits_for(dialect.name, dialect.driver) if dialect.driver != self._driver else self._traits
        tx = Tx(connection, self._models, traits, self._now)
        with translated("enqueue_in"):
            rows = outbox.store_in(tx, submit, self._channel)
        return _submitted(rows, submit.snapshots)

    def announce(self, queues: Collection[str]) -> None:
        """Wake this process's `wait_for_work` callers waiting on ``queues``."""
        self._signals.bump(check_queues(queues))

    def _store_alone(self, item: NewTask) -> dict[str, Any] | None:
        """A single task stored by one statement in autocommit, where the dialect can
        (``dml_ctes``): its row. None when it cannot, or when its id is taken (nothing
        changed): the transaction runs."""
        if self._traits.dml_ctes:
            return self._run(
                "submit",
                lambda tx: create.enqueue_one_in_one_statement(tx, item, self._channel),
                one_statement=True,
            )
        return None

    def _check_payloads(self, items: Sequence[NewTask]) -> None:
        """Refuse, before anything is sent, a payload the server could not take."""
        limit = self._ready()
        if limit is not None:
            for item in items:
                create.check_value_size(item.payload, limit, what=f"payload of task {item.id}")

    def replay(self, replay: Replay) -> Task:
        """Create execution ``replay.new_id`` re-running ``replay.execution_id``, atomically
        with the checks.

        Checks in this order: `TaskNotFoundError`, `ReplayNotFinalError`,
        `AlreadyReplayedError`, `CompletedNotAllowedError`; ``new_id`` in use: `ValueError`.
        """
        payload = replay.payload
        if not isinstance(payload, Unset):
            create.check_value_size(payload, self._ready(), what="payload")
        return self._run(
            "replay",
            lambda tx: create.replay(tx, replay),
        )

    # -- tasks: read -----------------------------------------------------------------------

    def get(self, task_id: str) -> Task:
        """The current snapshot of ``task_id``."""
        check_identifier(task_id, what="task id")
        return self._read("get", lambda tx: reads.get(tx, task_id), inline=True)

    def list(self, filter: Filter) -> builtins.list[Task]:
        """Tasks matching ``filter``, sorted by ``(created_at, id)``, then offset, then limit.

        ``Filter(business_key=k)`` alone: every execution of ``k``, oldest first by the replay
        chain (which orders them where timestamps tie), read through the business-key index.
        """
        if not isinstance(filter, Filter):
            raise TypeError(f"list takes a Filter, got {type(filter).__name__}")
        if filter.business_key is not None:
            check_identifier(filter.business_key, what="business_key")  # no such key can be stored
        key = _key_alone(filter)
        if key is not None:
            return self._read("list", lambda tx: reads.history(tx, key))
        return self._read("list", lambda tx: reads.list_tasks(tx, filter))

    def counts(self) -> dict[str, dict[Status, int]]:
        """Task counts by type and status, from the (type, status) index; zero counts are absent."""
        return self._read("counts", reads.counts)

    def queue_state(self, query: QueueQuery) -> QueueState:
        """Pending plus retrying tasks of ``query.queue`` (due or not), from the claim index,
        ``query.quota``'s current window (its row, if any) and the tasks ``query.unhandled``
        names (a range of the claim index) -- one SELECT."""
        if not isinstance(query, QueueQuery):
            raise TypeError(f"queue_state takes a QueueQuery, got {type(query).__name__}")
        return self._read("queue_state", lambda tx: reads.queue_state(tx, query))

    def hold(self, hold: Hold) -> datetime | None:
        """Hold ``hold.queue`` (keeping a longer hold) or end its hold, under its row's lock in
        ``<prefix>queue_limits`` (`taskgate.brokers.sql.holds`); its hold after the call."""
        if not isinstance(hold, Hold):
            raise TypeError(f"hold takes a Hold, got {type(hold).__name__}")
        return self._run("hold", lambda tx: holds.hold(tx, hold))

    def _read(self, operation: str, step: Callable[[Tx], _T], *, inline: bool = False) -> _T:
        """Run a read of ONE statement: in autocommit where the driver switches a connection to
        it for free (psycopg: no BEGIN and COMMIT), else in a read-only transaction (SQLite;
        MySQL, where PyMySQL's switch costs a round trip each way, more than the COMMIT).
        ``inline``: see `_run` (a read that may return many rows is not attempted on an event
        loop)."""
        one_statement = self._traits.cheap_autocommit
        return self._run(operation, step, read_only=True, one_statement=one_statement, inline=inline)

    # -- tasks: the worker's transitions ---------------------------------------------------

    def claim(self, claim: Claim) -> Claimed:
        """Write ``claim.acks`` quietly, then lease up to ``claim.limit`` due tasks of
        ``claim.queue`` in claim order (priority, ``run_at``, id), within ``claim.quota`` if given.

        Acks and claim are ONE transaction on every dialect (``Claimed.failed`` is never set):
        a failure of either rolls back both and raises. With ``claim.shared`` the queue's
        slots and start rate are counted for every process of the database
        (`taskgate.brokers.sql.slots`).
        """
        acks = claim.acks
        self._check_results(acks)
        if claim.shared is not None:
            return self._claim_shared(claim)
        if claim.quota is not None:
            return self._claim_within_quota(claim)
        if acks:
            return self._claim_after_acks(claim)
        return self._claim(claim)

    def _claim_shared(self, claim: Claim) -> Claimed:
        """``claim.acks`` (quietly), then the claim under its shared limits (and quota), in one
        transaction."""
        queue, lease_ttl, quota, acks = claim.queue, claim.lease_ttl, claim.quota, claim.acks
        types = claim.types
        # A crash may undo the claim together with its slots and starts; not acks or units.
        durable = bool(acks) or quota is not None
        small = len(acks) + claim.limit <= INLINE_MAX_ROWS
        hand_over = slots.can_hand_over(claim)
        if hand_over and self._traits.dml_ctes and not acks:
            handed = self._run(
                "claim", lambda tx: tx.one(slots.hand_over_plan(tx, claim)), one_statement=True, inline=small
            )
            if handed is not None:
                return handed
            hand_over = False  # nothing to hand over: count, in a transaction

        def step(tx: Tx) -> Claimed:
            answers = batch.ack_many(tx, acks, snapshots=False) if acks else []

            def oldest_due(k: int) -> builtins.list[Lease]:
                return leases.claim(tx, queue, k, lease_ttl, durable=durable, types=types)

            def take(n: int, lease_up_to: slots.LeaseUpTo | None) -> Claimed:
                lease = oldest_due if lease_up_to is None else lease_up_to
                if quota is None:
                    return Claimed(lease(n))
                return _claim_within_units(tx, quota, n, lease)

            claimed = slots.hand_over(tx, claim, take) if hand_over else None
            if claimed is None:
                claimed = slots.claim_shared(tx, claim, take)
            return _with_acks(holds.answer_if_held(tx, queue, claimed), answers)

        return self._run("claim", step, inline=small)

    def _claim(self, claim: Claim) -> Claimed:
        """A claim alone: one statement in autocommit on PostgreSQL, a transaction elsewhere
        (which reads the queue's hold only when it leased nothing)."""
        queue, limit, lease_ttl, types = claim.queue, claim.limit, claim.lease_ttl, claim.types
        if self._traits.dml_ctes:
            step = lambda tx: leases.claim_in_one_statement(tx, queue, limit, lease_ttl, types=types)  # noqa: E731
            return self._run("claim", step, one_statement=True)

        def claimed(tx: Tx) -> Claimed:
            return holds.answer_if_held(
                tx, queue, Claimed(leases.claim(tx, queue, limit, lease_ttl, types=types))
            )

        return self._run("claim", claimed, inline=limit <= INLINE_MAX_ROWS)

    def _claim_after_acks(self, claim: Claim) -> Claimed:
        """The acks (quietly), then the claim, in ONE transaction (one commit where the two
        take two)."""
        acks, queue, limit, lease_ttl = claim.acks, claim.queue, claim.limit, claim.lease_ttl
        types = claim.types

        def step(tx: Tx) -> Claimed:
            acked = batch.ack_many(tx, acks, snapshots=False)
            return holds.answer_if_held(
                tx, queue, Claimed(leases.claim(tx, queue, limit, lease_ttl, types=types), acked=acked)
            )

        return self._run("claim", step, inline=len(acks) + limit <= INLINE_MAX_ROWS)

    def _claim_within_quota(self, claim: Claim) -> Claimed:
        """``acks`` (quietly), then the claim within the quota, in one transaction: a unit of
        the window per task claimed. Without acks, PostgreSQL claims in one statement."""
        acks, queue, limit, lease_ttl = claim.acks, claim.queue, claim.limit, claim.lease_ttl
        quota, types = claim.quota, claim.types
        assert quota is not None
        small = len(acks) + limit <= INLINE_MAX_ROWS

        def acked(tx: Tx) -> builtins.list[ItemAnswer]:
            return batch.ack_many(tx, acks, snapshots=False) if acks else []

        if self._traits.dml_ctes and not acks:
            taken = self._run(
                "claim",
                lambda tx: quota_claim.claim_within_quota_in_one_statement(
                    tx, queue, limit, lease_ttl, quota, types
                ),
                one_statement=True,
                inline=small,
            )
            if taken is not None:
                return taken  # else the window has no row yet: the transaction opens it
        elif not self._traits.dml_ctes:

            def counted(tx: Tx) -> Claimed:
                answers = acked(tx)
                claimed = quota_claim.claim_then_count(tx, queue, limit, lease_ttl, quota, types)
                return _with_acks(holds.answer_if_held(tx, queue, claimed), answers)

            try:
                return self._run("claim", counted, inline=small)
            except quota_claim.ShortWindow:
                pass  # rolled back (the acks too): the window is short or has no row yet

        def step(tx: Tx) -> Claimed:
            answers = acked(tx)
            claimed = _claim_within_units(
                tx, quota, limit, lambda k: leases.claim(tx, queue, k, lease_ttl, types=types)
            )
            return _with_acks(holds.answer_if_held(tx, queue, claimed), answers)

        return self._run("claim", step, inline=small)

    def settle(self, settle: Settle) -> builtins.list[ItemAnswer]:
        """End the runs of ``settle.items`` in ONE transaction, then give back
        ``settle.give_back``'s quota units in it; one answer per item, in order.

        Items are independent: a stale token or an unknown id answers its own item with
        `LeaseLostError`/`TaskNotFoundError`. Only completions are set-based statements
        (`taskgate.brokers.sql.batch`): the rest, and a lone completion whose snapshot is
        asked for, are written one task at a time (`finish`). A result larger than the server
        accepts raises `ValueError` before anything is written. ``give_back.slots`` are freed
        in the same transaction.
        """
        give_back = settle.give_back
        returned: builtins.list[tuple[QuotaGrant, int]] = []
        slot_queue: str | None = None
        slot_tokens: tuple[str, ...] = ()
        if give_back is not None:
            returned = [(grant, n) for grant, n in give_back.quota if n]
            slot_queue, slot_tokens = give_back.queue, give_back.slots
        items, snapshots = settle.items, settle.snapshots
        if not items and not returned and not slot_tokens:
            return []
        self._check_results(items)
        write = _settle_write(items, snapshots)

        def step(tx: Tx) -> builtins.list[ItemAnswer]:
            answers = write(tx) if items else []
            for grant, n in returned:
                quotas.release_quota(tx, grant, n)
            if slot_queue is not None:
                slots.give_back_slots(tx, slot_queue, slot_tokens)
            return answers

        return self._run("settle", step, inline=len(items) <= INLINE_MAX_ROWS)

    def _check_results(self, items: Sequence[Finish]) -> None:
        """Refuse, before anything is sent, a result the server could not take."""
        limit = self._ready()
        if limit is not None:
            for item in items:
                if type(item) is Complete:
                    create.check_value_size(item.result, limit, what=f"result of task {item.task_id}")

    def heartbeat(self, heartbeat: Heartbeat) -> Renewal:
        """Extend the lease to ``now + lease_ttl`` and report whether a cancel was requested.

        An expired lease that no reaper took back yet is still held and can be renewed.
        With ``slot_queue`` the lease's slot is renewed with it, when still held (else
        ``slot_lost``).
        """
        task_id, token, lease_ttl = heartbeat.task_id, heartbeat.token, heartbeat.lease_ttl
        slot_queue, progress = heartbeat.slot_queue, heartbeat.progress

        def step(tx: Tx) -> Renewal:
            renewal = leases.heartbeat(tx, task_id, token, lease_ttl, progress)
            return renewal if slot_queue is None else slots.renew_slot(tx, slot_queue, renewal, token)

        return self._run("heartbeat", step)

    # -- tasks: anyone's transitions -------------------------------------------------------

    def cancel(self, task_id: str) -> Task:
        """Cancel a task.

        blocked/pending/retrying: ``canceled`` at once, with its descendants (cascade).
        running: only marked (again: no error); the holder sees it on its next heartbeat.
        Final: raises `AlreadyFinalError`.
        """
        check_identifier(task_id, what="task id")
        return self._run("cancel", lambda tx: finish.cancel(tx, task_id))

    def prune(self, prune: Prune) -> int:
        """Delete up to ``prune.limit`` final tasks it names (see `Broker.prune`), oldest
        created first, in one transaction (`taskgate.brokers.sql.prune`); how many went."""
        if not isinstance(prune, Prune):
            raise TypeError(f"prune takes a Prune, got {type(prune).__name__}")
        return self._run("prune", lambda tx: pruning.prune(tx, prune), inline=False)

    def step(self, step: Step) -> bytes | None:
        """Read step ``step.name`` of ``step.task_id``, or store ``step.result`` unless one is
        stored (the first writer wins) -- one transaction in ``<prefix>steps``
        (`taskgate.brokers.sql.steps`); the result stored after the call, None when none is.
        A result larger than the server accepts raises `ValueError` before anything is sent."""
        if not isinstance(step, Step):
            raise TypeError(f"step takes a Step, got {type(step).__name__}")
        if step.result is None:
            return self._read("step", lambda tx: steps.read_step(tx, step), inline=True)
        create.check_value_size(step.result, self._ready(), what=f"result of step {step.name!r}")
        return self._run("step", lambda tx: steps.store_step(tx, step))

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
        ``compensations`` in the same transaction), any other goes back to ``pending`` due now.
        """
        check_count(lease_lost_max, what="lease_lost_max", minimum=1)
        check_count(limit, what="reap limit", minimum=1)
        compensate = check_compensations(compensations)
        return self._run("reap", lambda tx: leases.reap(tx, lease_lost_max, limit, compensate), inline=False)

    # -- what transitions settle on their own -----------------------------------------------

    def report_settled(self, sink: SettledSink | None) -> None:
        """Give ``sink`` the snapshots of the tasks each later call settles on its own (see
        `taskgate.brokers.base.Broker.report_settled`): collected in the transaction from the
        rows settling locks anyway, handed on after its commit; None stops it."""
        self._sink = sink

    # -- wake-ups and lifecycle -------------------------------------------------------------

    def wait_for_work(self, queues: Collection[str], timeout: float) -> bool:
        """Block up to ``timeout`` seconds until work may be due in ``queues``.

        True at once when a task of ``queues`` is due already. Otherwise woken by this
        process's transitions, by other processes' through LISTEN/NOTIFY on PostgreSQL, and
        everywhere by a cheap "anything due?" index probe every ``poll_interval`` (which also
        notices delayed tasks falling due). False on timeout, and once the broker is closed.
        """
        names = check_queues(queues)
        seconds = check_timeout(timeout)
        if nowait.active():
            raise nowait.WouldBlock("wait_for_work blocks")
        if self._closed or not names:
            return False if self._closed else self._signals.wait([], [], seconds)
        self._ready()
        self._ensure_listener()
        deadline = time.monotonic() + seconds
        seen = self._signals.seen(names)
        while not self._closed:
            if self._read("wait_for_work", lambda tx: reads.anything_due(tx, names), inline=True):
                return True
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            if self._signals.wait(names, seen, min(self._poll, remaining)):
                return True
        return False

    def close(self) -> None:
        """Wake every waiter, stop listening and release connections; later calls raise
        `BrokerError`. An engine passed in by the application stays open. Idempotent."""
        if self._closed:
            return
        self._closed = True
        self._signals.close()
        self._dispose()

    # -- split calls (PostgreSQL) -----------------------------------------------------------

    def split(self, method: Callable[..., _T], /, *args: Any, **kwargs: Any) -> SplitCall[_T] | None:
        """Send a one-statement call (a submit of one task, a claim carrying no acks, `get`)
        from the event loop on the held connection (`taskgate.brokers.sql.pg_split`); see
        `taskgate.brokers.split.SplitCaller`. Anything else, or no idle held connection, or a
        server clock due for a reading: None, nothing sent."""
        planner = _SPLIT_PLANS.get(getattr(method, "__func__", None))
        # Keyed by SQLBroker's own functions: a subclass's override runs whole, in a thread.
        if planner is None or getattr(method, "__self__", None) is not self:
            return None
        held, send = self._autocommit_held(), self._send_split
        now = self._now_without_reading()
        if held is None or send is None or now is None or self._closed or not self._prepared_schema:
            return None
        conn = held.take()
        if conn is None:
            return None
        try:
            tx = Tx(conn, self._models, self._traits, self._now, _now=now)
            # A schema map or a tracer (cursor events, statement logging) needs SQLAlchemy's
            # own execution, which a split call bypasses.
            plan = planner(self, tx, *args, **kwargs) if preparable(conn) and not traced(conn) else None
            prepared = None if plan is None else self._prepared.get(plan.statement, conn.dialect)
        except BaseException:
            held.give_back(conn)
            raise
        if plan is None or prepared is None:
            held.give_back(conn)
            return None
        answer = plan.answer

        def answered(rows: Sequence[Mapping[str, Any]]) -> Any:
            result = answer(rows)
            if tx.woken:
                self._signals.bump(tx.woken)
            return result

        call: SplitCall[_T] | None = send(held, conn, prepared, plan.params, answered)
        return call

    def _now_without_reading(self) -> datetime | None:
        """`_now` when it needs no round trip: None when the server's clock is due for a reading."""
        if self._clock is not None:
            return utc(self._clock.now())
        if self._traits.host_clock:
            return None
        return self._server_clock.now_if_fresh()

    def _plan_get(self, tx: Tx, task_id: str) -> OneStatement[Task]:
        check_identifier(task_id, what="task id")
        return task_of_plan(tx, task_id)

    def _plan_claim(self, tx: Tx, claim: Claim) -> OneStatement[Claimed] | None:
        """A claim without acks: its one statement (within the quota, if given; handing its
        slots over, under shared limits that allow it)."""
        if claim.acks:
            return None  # a transaction
        if claim.shared is not None:
            if not slots.can_hand_over(claim):
                return None  # counted, in a transaction
            return slots.hand_over_plan(tx, claim).then(_or_thread)  # None: count them instead
        if claim.quota is not None:
            plan = quota_claim.claim_within_quota_plan(
                tx, claim.queue, claim.limit, claim.lease_ttl, claim.quota, claim.types
            )
            return plan.then(_or_thread)  # None: the window has no row yet, which a transaction opens
        return leases.claim_plan(tx, claim.queue, claim.limit, claim.lease_ttl, types=claim.types)

    def _plan_submit(self, tx: Tx, submit: Submit) -> OneStatement[Submitted] | None:
        """The one-statement insert of a single task (a batch: None)."""
        if len(submit.tasks) != 1 or submit.max_pending:
            return None
        self._check_payloads(submit.tasks)
        snapshots = submit.snapshots
        return create.enqueue_one_plan(tx, submit.tasks[0], self._channel).then(
            lambda stored: _submitted([_or_thread(stored)], snapshots)
        )

    # -- the one transaction runner --------------------------------------------------------

    def _run(
        self,
        operation: str,
        step: Callable[[Tx], _T],
        *,
        read_only: bool = False,
        one_statement: bool = False,
        inline: bool = True,
    ) -> _T:
        """Run ``step`` in one transaction: retried on deadlocks, errors translated, wake-ups sent.

        ``one_statement``: ``step`` sends exactly one statement (which announces its own
        wake-ups), so it runs in autocommit -- atomic by itself, without BEGIN and COMMIT.
        ``inline``: the transition is small enough to be attempted on an event loop under
        `nowait.no_wait` (see `_attempt_without_waiting`); if False such an attempt is refused.
        """
        if self._closed:
            raise BrokerError("SQLBroker is closed")
        if not self._prepared_schema:
            self._ready()
        if nowait.active():
            if not inline:
                raise nowait.WouldBlock(f"{operation} may take long")
            result, settled = self._attempt_without_waiting(operation, step, read_only, one_statement)
        else:
            with translated(operation):
                result, settled = run_with_retries(
                    lambda: self._attempt(step, read_only, one_statement), self._traits.is_retryable
                )
        if settled:
            self._report(settled)  # committed, and every lock released
        return result

    def _attempt_without_waiting(
        self, operation: str, step: Callable[[Tx], _T], read_only: bool, one_statement: bool
    ) -> tuple[_T, builtins.list[Task] | None]:
        """One attempt that waits for nothing: no busy lock, no full pool, no back-off sleep.

        Whatever would have waited -- this process's writer lock, the file's write lock held by
        another process, a transaction a retryable error rolled back -- raises `WouldBlock`
        with nothing changed, for the caller to run the transition again in a thread.
        """
        lock = self._lock_for(read_only)
        if lock is not None and not lock.acquire(blocking=False):
            raise nowait.WouldBlock(f"{operation}: another thread is writing")
        try:
            if _pool_is_full(self._engine):
                raise nowait.WouldBlock(f"{operation}: every pooled connection is in use")
            with translated(operation):
                try:
                    return self._attempt(step, read_only, one_statement, locked=True)
                except Exception as exc:
                    if isinstance(exc, Conflict) or self._traits.is_retryable(exc):
                        raise nowait.WouldBlock(f"{operation}: {exc}") from exc
                    raise
        finally:
            if lock is not None:
                lock.release()

    def _attempt(
        self, step: Callable[[Tx], _T], read_only: bool, one_statement: bool, *, locked: bool = False
    ) -> tuple[_T, builtins.list[Task] | None]:
        """One attempt of `_run`: ``step``'s answer, and the snapshots of the tasks it settled
        on its own (``tx.settled``) once its transaction committed."""
        if one_statement:
            with self._statement_connection() as conn:
                tx = self._tx(conn)
                result = step(tx)
        else:
            turn = nullcontext() if locked else self._serialized(read_only)
            with turn, self._transaction(read_only) as conn:
                tx = self._tx(conn)
                result = step(tx)
                if tx.woken:
                    self._traits.notify(conn, self._channel, sorted(tx.woken))
        if tx.woken:
            self._signals.bump(tx.woken)
        return result, tx.settled

    def _report(self, settled: builtins.list[Task]) -> None:
        """Hand a committed transaction's settled snapshots to the sink (if one is still set)."""
        sink = self._sink
        if sink is not None:
            sink(settled)

    def _autocommit_held(self) -> HeldConnection | None:
        """The held connection when it is the one in autocommit (PostgreSQL's)."""
        held = self._held
        return held if held is not None and not held.transactions else None

    def _statement_connection(self) -> AbstractContextManager[Connection]:
        """A connection in autocommit for one statement: the held one when it is in autocommit
        and free, else a pooled one (only dialects whose driver switches it to autocommit
        without a round trip send statements alone: psycopg)."""
        held = self._autocommit_held()
        return self._autocommit.connect() if held is None else held.use()

    def _transaction(self, read_only: bool) -> AbstractContextManager[Connection]:
        """A connection inside a new transaction: a write's on the held one when it is for
        transactions and free, anything else on a pooled one."""
        if read_only:
            return self._reader.begin()
        held = self._held if self._held_writes is None else self._held_writes
        if held is not None and held.transactions:
            return held.use()
        return self._engine.begin()

    def _tx(self, conn: Connection) -> Tx:
        settled: builtins.list[Task] | None = [] if self._sink is not None else None
        return Tx(conn, self._models, self._traits, self._now, prepared=self._prepared, settled=settled)

    def _now(self, conn: Connection) -> datetime:
        """THE time source: the injected clock if any, else the database server's clock."""
        if self._clock is not None:
            return utc(self._clock.now())
        if self._traits.host_clock:
            return self._traits.server_now(conn)
        return self._server_clock.now(conn)

    def _lock_for(self, read_only: bool) -> threading.Lock | None:
        """The in-process lock a transaction takes: the shared connection's, or the writers' turn."""
        return self._serial if self._serial is not None else None if read_only else self._writers

    @contextmanager
    def _serialized(self, read_only: bool) -> Iterator[None]:
        lock = self._lock_for(read_only)
        with lock if lock is not None else nullcontext():
            yield

    def _ensure_listener(self) -> None:
        if not self._traits.push_wakeups or self._listener is not None:
            return
        with self._listener_lock:
            if self._listener is None and not self._closed:
                self._listener = Listener(self._engine, self._channel, self._signals)

    def after_fork_in_child(self) -> None:
        """In a forked child: set the parent's connections aside (`taskgate.forks`)
        and start from fresh ones, and from fresh locks (a thread of the parent may have held
        one at the fork; that thread does not exist here to release it)."""
        self._serial = threading.Lock() if self._serial is not None else None
        self._writers = threading.Lock() if self._writers is not None else None
        self._listener_lock = threading.Lock()
        self._schema_lock = threading.Lock()
        self._signals.after_fork_in_child()
        self._server_clock.after_fork_in_child()
        # The listener's thread is the parent's: this process LISTENs on a connection of its own.
        if self._listener is not None:
            forks.keep_inherited(self._listener)
            self._listener = None
        for held in (self._held, self._held_writes):
            if held is not None:
                held.after_fork_in_child()
        # An in-memory SQLite database was copied with the process: its one connection is this
        # process's own. An application's engine is the application's to reset, as SQLAlchemy
        # advises for any engine that crosses a fork.
        if self._owns_engine and not is_memory_sqlite(self._engine.url):
            forks.keep_inherited(self._engine.pool)
            self._engine.dispose(close=False)

    def _dispose(self) -> None:
        with self._listener_lock:
            if self._listener is not None:
                self._listener.stop()
        for held in (self._held, self._held_writes):
            if held is not None:
                held.close()
        if self._owns_engine:
            self._engine.dispose()


def _open_engine(url_or_engine: str | URL | Engine) -> tuple[Engine, bool, bool]:
    """(engine, whether we own it, whether it is an in-memory SQLite database)."""
    if isinstance(url_or_engine, Engine):
        engine = prepare_engine(url_or_engine)
        return engine, False, is_memory_sqlite(engine.url)
    if isinstance(url_or_engine, str | URL):
        url = normalize_url(url_or_engine)
        try:
            engine = make_engine(url)
        except ImportError as exc:  # SQLAlchemy imports the URL's driver here
            raise missing_driver(url.drivername, url.get_driver_name(), exc) from exc
        return engine, True, is_memory_sqlite(url)
    raise TypeError(f"SQLBroker needs a database URL or an Engine, got {type(url_or_engine).__name__}")


def _pool_is_full(engine: Engine) -> bool:
    """True when a checkout could wait: every connection a `QueuePool` keeps is in use."""
    pool = engine.pool
    return isinstance(pool, QueuePool) and pool.checkedout() >= pool.size()


def _submitted(rows: Sequence[Mapping[str, Any]], snapshots: bool) -> Submitted:
    """`submit`'s answer from the rows it stored: their statuses, and their snapshots when asked."""
    if not snapshots:
        return Submitted([STATUS_BY_VALUE[row["status"]] for row in rows])
    tasks = [snapshot(row) for row in rows]
    return Submitted([task.status for task in tasks], tasks)


def _key_alone(filter: Filter) -> str | None:
    """The business key of a filter that names nothing else (no other field, offset or limit)."""
    if filter.type is None and filter.queue is None and filter.status is None and filter.group is None:
        if filter.parent is not None:
            return None
        if not filter.limit and not filter.offset:
            return filter.business_key
    return None


def _settle_write(items: tuple[Finish, ...], snapshots: bool) -> Callable[[Tx], builtins.list[ItemAnswer]]:
    """How `settle` writes ``items``: completions set-based (`batch`), but a lone one whose
    snapshot is asked for as a single ack always was (`finish.ack`); anything else one item
    at a time (`finish.settle_each`)."""
    if all(type(item) is Complete for item in items) and (len(items) > 1 or not snapshots):
        acks = cast("tuple[Complete, ...]", items)
        return lambda tx: batch.ack_many(tx, acks, snapshots=snapshots)
    return lambda tx: finish.settle_each(tx, items, snapshots=snapshots)


def _claim_within_units(
    tx: Tx, quota: QuotaSpec, limit: int, lease_up_to: Callable[[int], builtins.list[Lease]]
) -> Claimed:
    """Reserve up to ``limit`` units of ``quota``'s window, lease that many tasks, and give back
    the units no task took -- in the caller's transaction (durable: units must survive a crash)."""
    grant = quotas.reserve_quota(tx, quota.key, quota.limit, quota.period, limit)
    return quota_claim.claim_within_grant(
        grant, lease_up_to, lambda unused_of, n: quotas.release_quota(tx, unused_of, n)
    )


def _with_acks(claimed: Claimed, acked: builtins.list[ItemAnswer]) -> Claimed:
    return dataclasses.replace(claimed, acked=acked) if acked else claimed


def _check_poll_interval(value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value <= 60:
        raise ConfigError(f"poll_interval must be a number of seconds in (0, 60], got {value!r}")
    return float(value)


def _or_thread(answer: _T | None) -> _T:
    """A split statement's answer, or `WouldBlock` when it did nothing and the thread path
    takes over (a taken id or key, a parent missing or final: its checks name what was wrong;
    a quota window without its row yet: its transaction opens it)."""
    if answer is None:
        raise nowait.WouldBlock("the one statement changed nothing")
    return answer


# The methods `SQLBroker.split` sends from the event loop, each with the plan of its statement.
_SPLIT_PLANS: dict[object, Callable[..., OneStatement[Any] | None]] = {
    getattr(SQLBroker, name): getattr(SQLBroker, f"_plan_{name}") for name in ("get", "claim", "submit")
}
