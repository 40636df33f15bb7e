"""Group commit of acks: handlers of one queue that finish together complete in ONE `settle`.

A worker whose handler returned hands the ack to the queue's `AckWriter` and goes on to its
next task: nothing per task waits for the write. The writer is one long-lived task per queue;
while a write is in flight, the acks that arrive pile up and go out together in the next one.
The batch size thus follows the load (one at a time when idle, every finished handler of a
round trip under load) with no fixed delay.

Acks waiting for the writer count against the queue's claims beyond an allowance of a few
rounds of ``workers`` (`backlog_beyond`), so a slow medium slows the claims instead of growing
the backlog without bound. A crash
before a write leaves those tasks running under their leases: the reaper puts them back and
they run again -- a re-run, never a loss. Shutdown waits for every write (the writer drains
before it ends, shielded when the runtime is cancelled).

Where the broker gains by it (``capabilities.acks_in_claims``, quiet acks only), the acks
waiting when the queue's scheduler claims ride on that claim (`Claim.acks`, `with_claim`):
under load a queue's handlers finish together and its next claim follows at once, so one
broker call does both. The writer then
writes only what no claim took: acks of an idle queue, or that arrived during a claim.

An ack the broker refuses (a result too large for it: any error but a `BrokerError`, a lost
lease or a task no longer running) fails its task once with that reason; the other acks of
its batch are written one by one. Running the task again would only compute the same result.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Awaitable, Callable, Mapping, Sequence

import anyio
import anyio.lowlevel

from taskgate.brokers.base import Broker
from taskgate.brokers.params import Claimed, Compensation, Complete, Fail, ItemAnswer, Settle
from taskgate.errors import AlreadyFinalError, BrokerError, LeaseLostError, TaskNotFoundError
from taskgate.runtime.calls import BrokerCalls
from taskgate.runtime.outcome import describe, unstorable_result
from taskgate.runtime.signals import Signal
from taskgate.task import Task

__all__ = ["MAX_ACK_BATCH", "RIDE_MAX", "WRITE_TRIES", "AckWriter"]

log = logging.getLogger("taskgate")

# Items per `settle`: bounds one statement/script; more wait for the next write.
MAX_ACK_BATCH = 256
# Acks waiting beyond this many go out in a write of their own rather than on the claim: a
# call's own cost is then small beside their work, and that write overlaps the claim (Redis
# `process.w100` lost 15 % when every batch rode).
RIDE_MAX = 32
# Tries of a write the broker could not take (medium down or too slow) before giving the
# tasks up to the reaper.
WRITE_TRIES = 3

Settled = Callable[[list[Task]], Awaitable[None]]
Completed = Callable[[list[str]], None]
Answer = ItemAnswer | Exception


class AckWriter:
    """The acks of one queue, written in batches by `run`; `put` never waits."""

    def __init__(
        self,
        broker: Broker,
        calls: BrokerCalls,
        *,
        deadline: float,
        on_settled: Settled,
        on_completed: Completed | None = None,
        on_written: Callable[[], None] = lambda: None,
        max_batch: int = MAX_ACK_BATCH,
        compensations: Callable[[], Mapping[str, Compensation]] = dict,
    ) -> None:
        """``on_settled`` gets the snapshots of the tasks a write completed. With
        ``on_completed``, acks are written without snapshots (``Settle.snapshots=False``):
        ``on_completed`` then gets the ids of the tasks completed that way.
        ``compensations()``: by task type, what a task failed for an unstorable result submits
        with its failure (`Gate.handle`'s ``on_failure``)."""
        self._broker, self._calls, self._deadline = broker, calls, deadline
        self._on_settled, self.on_written = on_settled, on_written
        self._on_completed = on_completed
        self._snapshots = on_completed is None
        self.rides_on_claims = not self._snapshots and broker.capabilities.acks_in_claims
        self._max_batch = max_batch
        self._compensations = compensations
        self._queued: deque[Complete] = deque()
        self._arrived = Signal()
        self._closed = False
        self.in_flight = 0
        self._riding = 0  # acks a claim took and has not answered yet

    @property
    def backlog(self) -> int:
        """Acks handed in and not yet answered (queued, being written, or riding a claim)."""
        return len(self._queued) + self.in_flight + self._riding

    def backlog_beyond(self, allowance: int) -> int:
        """How far the backlog exceeds ``allowance`` (0 when it does not)."""
        return max(0, self.backlog - allowance)

    def put(self, task_id: str, token: str, result: bytes | None) -> None:
        """Queue an ack; the writer completes the task."""
        if self._closed:
            raise RuntimeError("the ack writer is closed")
        self._queued.append(Complete(task_id, token, result))
        self._arrived.fire()

    def close(self) -> None:
        """Take no more acks; `run` returns once everything queued is written."""
        self._closed = True
        self._arrived.fire()

    async def run(self) -> None:
        """Write what is queued until `close`d and drained; a cancelled writer drains shielded."""
        try:
            while self._queued or not self._closed:
                if not self._queued:
                    await self._arrived.wait(None)
                    continue
                # One loop tick: acks of handlers finishing right now join this write, and a
                # scheduler woken by the same handlers may take them along on its claim.
                await anyio.lowlevel.checkpoint()
                if self._queued:
                    await self._write_next()
        finally:
            with anyio.CancelScope(shield=True):
                while self._queued:
                    await self._write_next()

    async def with_claim(self, claim: Callable[[tuple[Complete, ...]], Awaitable[Claimed]]) -> Claimed:
        """Claim by ``claim(acks)`` taking the queued acks along, or by ``claim(())`` when none
        wait or they cannot ride (`rides_on_claims`).

        A claim that failed once its acks were written (`Claimed.failed`) raises `BrokerError`
        here. When ``claim(acks)`` raises, the acks go back to the queue for the writer: when
        the broker refused them before writing anything (a result too large for it: anything
        but a `BrokerError`), each is then acked on its own (and a refused one failed), and the
        claim goes alone.
        """
        if not self.rides_on_claims or not self._queued or len(self._queued) > RIDE_MAX:
            return await claim(())
        count = min(len(self._queued), self._max_batch)
        acks = tuple(self._queued.popleft() for _ in range(count))
        self._riding += count
        try:
            claimed = await claim(acks)
        except BrokerError:
            self._put_back(acks)
            raise
        except Exception:
            self._put_back(acks)
            return await claim(())
        except BaseException:
            self._put_back(acks)
            raise
        self._riding -= count
        _, completed = _completed(acks, claimed.acked)
        if completed and self._on_completed is not None:
            self._on_completed(completed)
        self.on_written()
        if claimed.failed is not None:
            raise BrokerError(
                f"the claim after {count} ack(s) failed (the acks were written): {claimed.failed}"
            )
        return claimed

    def _put_back(self, acks: Sequence[Complete]) -> None:
        """Acks a claim took but may not have written: first in line for the writer again. A
        second write of an ack the claim did write answers lease-lost and changes nothing."""
        self._riding -= len(acks)
        self._queued.extendleft(reversed(acks))
        self._arrived.fire()

    async def _write_next(self) -> None:
        count = min(len(self._queued), self._max_batch)
        batch = [self._queued.popleft() for _ in range(count)]
        self.in_flight = count
        try:
            # Every await on the way is shielded (`_write` shields its own): the batch is out
            # of the queue, so a write the runtime's cancellation cut short would be lost.
            settled, completed = await self._write(batch)
            if completed and self._on_completed is not None:
                self._on_completed(completed)
            if settled:
                with anyio.CancelScope(shield=True):
                    await self._on_settled(settled)
        finally:
            self.in_flight = 0
            self.on_written()

    async def _write(self, batch: list[Complete]) -> tuple[list[Task], list[str]]:
        """Write ``batch`` (retrying a write that failed as a whole); the tasks it completed:
        their snapshots, and the ids of those completed without one (quiet acks)."""
        for attempt in range(1, WRITE_TRIES + 1):
            try:
                answers = await self._ack_many(batch)
            except BrokerError as exc:
                log.warning("writing %d ack(s) failed (try %d): %s", len(batch), attempt, exc)
                if attempt < WRITE_TRIES:
                    with anyio.CancelScope(shield=True):
                        await anyio.sleep(0.05 * 2**attempt)
                continue
            except Exception:
                log.exception("writing %d ack(s) failed; the reaper will take the tasks back", len(batch))
                return [], []
            done, quietly = _completed(batch, answers)
            refused = [
                (item, answer) for item, answer in zip(batch, answers, strict=True) if _refused(answer)
            ]
            if refused:
                done += await self._fail_refused(refused)
            return done, quietly
        log.error("%d ack(s) not written; the reaper will take the tasks back", len(batch))
        return [], []

    async def _fail_refused(self, refused: list[tuple[Complete, Answer]]) -> list[Task]:
        """Fail once, with the reason, each task whose ack the broker refused (a result it can
        never store: running the task again would only compute it again); their snapshots."""
        failed: list[Task] = []
        for ack, answer in refused:
            task_id = ack.task_id
            assert isinstance(answer, Exception)  # `_refused` says so
            outcome = unstorable_result(answer)
            log.warning("task %s: %s", task_id, outcome.error)
            try:
                with anyio.CancelScope(shield=True):
                    compensation = await self._compensation_of(task_id)
                    fail = Settle(
                        (Fail(task_id, ack.token, outcome.kind, outcome.error, compensation=compensation),)
                    )
                    (written,) = await self._calls(self._broker.settle, fail, deadline=self._deadline)
                if isinstance(written, Exception):
                    raise written
                if written is not None:
                    failed.append(written)
            except LeaseLostError:
                log.info("task %s: lease was lost before its outcome was written; discarded", task_id)
            except Exception as exc:
                log.warning("task %s: its failure was not written either: %s", task_id, describe(exc))
        return failed

    async def _compensation_of(self, task_id: str) -> Compensation | None:
        """The compensation the failure of ``task_id`` submits: its type's, when any type has
        one (an ack carries no type, so only then is the task read)."""
        compensations = self._compensations()
        if not compensations:
            return None
        task: Task = await self._calls(self._broker.get, task_id, deadline=self._deadline)
        return compensations.get(task.type)

    async def _ack_many(self, items: list[Complete]) -> Sequence[Answer]:
        settle = Settle(tuple(items), snapshots=self._snapshots)
        try:
            if self._calls.inline:
                # Called right here, with no checkpoint before it: nothing can cut it short, so
                # it needs no shielded scope (one per write was a tenth of a memory cycle);
                # `run` yields once per batch.
                return self._broker.settle(settle)
            with anyio.CancelScope(shield=True):
                return await self._calls(self._broker.settle, settle, deadline=self._deadline)
        except BrokerError:
            raise  # the medium failed: `_write` tries the whole batch again
        except Exception:
            pass
        # One item the broker refuses (a result too large for the server) must not fail the
        # others: ack them one by one so each gets its own answer.
        with anyio.CancelScope(shield=True):
            answers = [await self._ack_one(item) for item in items]
        return answers

    async def _ack_one(self, item: Complete) -> Answer:
        try:
            (answer,) = await self._calls(
                self._broker.settle, Settle((item,), snapshots=self._snapshots), deadline=self._deadline
            )
        except BrokerError:
            raise  # the medium failed: retry the whole batch
        except Exception as exc:
            return exc
        return answer


def _completed(batch: Sequence[Complete], answers: Sequence[Answer]) -> tuple[list[Task], list[str]]:
    """The tasks the answers completed (snapshots, and ids answered None by a quiet ack); the
    rest are logged (their outcome is not written)."""
    done: list[Task] = []
    quietly: list[str] = []
    for ack, answer in zip(batch, answers, strict=True):
        task_id = ack.task_id
        if isinstance(answer, Task):
            done.append(answer)
        elif answer is None:
            quietly.append(task_id)
        elif isinstance(answer, LeaseLostError):
            log.info("task %s: lease was lost before its outcome was written; discarded", task_id)
        elif not _refused(answer):  # a refused ack is failed instead (`AckWriter._fail_refused`)
            log.warning("task %s: outcome not written: %s", task_id, describe(answer))
    return done, quietly


def _refused(answer: Answer) -> bool:
    """Whether ``answer`` is the broker refusing the ack's value (a result too large, one it
    cannot take), rather than a task no longer this lease's (lost, gone, already final)."""
    return isinstance(answer, Exception) and not isinstance(
        answer, LeaseLostError | TaskNotFoundError | AlreadyFinalError | BrokerError
    )
