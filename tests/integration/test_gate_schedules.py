"""Schedules in running gates: one task per tick, catch-up after downtime, DST, bad input.

Time is the test's `ManualClock` (the brokers' clock, which the ticker reads). To know a
gate's ticker has looked at the clock's current time, each gate also ticks a `probe` schedule
of its own (every second) registered after the others: a ticker handles its schedules in order
in one pass, so once its probe's tick for the current second exists, every schedule before it
has handled that time.
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime, timedelta
from typing import Any

import anyio
import pytest
from gate_helpers import GUARD, Faulty, make_gate, until

from taskgate import (
    BrokerError,
    Config,
    ConfigError,
    Filter,
    Gate,
    ManualClock,
    QueueConfig,
    Retention,
    Schedule,
    Status,
)
from taskgate.brokers.base import Broker
from taskgate.brokers.memory import MemoryBroker
from taskgate.schedules import tick_key

pytestmark = pytest.mark.anyio

QUEUES = {"q": QueueConfig(workers=2)}
PROBE = "probe"


def at(*args: int) -> datetime:
    return datetime(*args, tzinfo=UTC)  # type: ignore[misc]


def probed(gate: Gate) -> Gate:
    """``gate`` with a probe schedule of its own registered last (every second)."""
    _probes[id(gate)] = gate.schedule(f"{PROBE}-{len(_probes)}", "* * * * * *", "q").name
    return gate


async def looked(gate: Gate, clock: ManualClock) -> None:
    """Wait until ``gate``'s ticker has handled every schedule at the clock's current time."""
    key = tick_key(_probes[id(gate)], clock.now().replace(microsecond=0))
    await until(lambda: _exists(gate, key))


_probes: dict[int, str] = {}


async def _exists(gate: Gate, key: str) -> bool:
    return bool(await gate.history(key))


async def ticks(gate: Gate, name: str) -> list[str]:
    """The tick times (UTC ISO) of ``name``'s tasks, in the order they were submitted."""
    prefix = f"schedule:{name}:"
    found = [t for t in await gate.list() if t.business_key and t.business_key.startswith(prefix)]
    return [t.business_key[len(prefix) :] for t in found if t.business_key]


def iso(*instants: datetime) -> list[str]:
    return [i.isoformat() for i in instants]


async def run_once(broker: Broker, clock: ManualClock, *schedules: Schedule) -> Gate:
    """Run a gate with ``schedules`` (and the probe) until it has looked at the clock's time."""
    gate = probed(make_gate(broker, QUEUES, schedules=list(schedules)))
    async with gate:
        await looked(gate, clock)
    return gate


async def test_a_new_schedule_submits_its_latest_tick_with_run_at_the_tick(gate_broker, clock):
    clock.set(at(2030, 1, 1, 10, 20, 30))
    gate = await run_once(gate_broker, clock, Schedule("hourly", "0 * * * *", "q", {"n": 1}, catch_up=True))
    assert await ticks(gate, "hourly") == iso(at(2030, 1, 1, 10))
    (task,) = await gate.history("schedule:hourly:2030-01-01T10:00:00+00:00")
    assert (task.type, task.json(), task.run_at, task.status) == (
        "q",
        {"n": 1},
        at(2030, 1, 1, 10),
        Status.PENDING,
    )


@pytest.mark.parametrize(("catch_up", "hours"), [(False, [10, 14]), (True, [10, 11, 12, 13, 14])])
async def test_after_downtime_catch_up_submits_the_latest_or_each_missed_tick_in_order(
    gate_broker, clock, catch_up, hours
):
    schedule = Schedule("hourly", "0 * * * *", "q", catch_up=catch_up)
    clock.set(at(2030, 1, 1, 10, 20))
    await run_once(gate_broker, clock, schedule)
    clock.set(at(2030, 1, 1, 14, 20))  # down for four hours
    gate = await run_once(gate_broker, clock, schedule)
    assert await ticks(gate, "hourly") == iso(*(at(2030, 1, 1, h) for h in hours))
    run_ats = [t.run_at for t in await gate.list(Filter(type="q")) if t.business_key.startswith("schedule:h")]
    assert run_ats == sorted(run_ats)


async def test_a_second_gate_starting_later_submits_no_tick_twice(gate_broker, clock):
    schedule = Schedule("hourly", "0 * * * *", "q", catch_up=True)
    clock.set(at(2030, 1, 1, 10, 20))
    first = probed(make_gate(gate_broker, QUEUES, schedules=[schedule]))
    async with first:
        await looked(first, clock)
        clock.set(at(2030, 1, 1, 12, 5))
        second = probed(make_gate(gate_broker, QUEUES, schedules=[schedule]))
        async with second:
            await looked(second, clock)
            await looked(first, clock)
    assert await ticks(first, "hourly") == iso(at(2030, 1, 1, 10), at(2030, 1, 1, 11), at(2030, 1, 1, 12))


async def test_two_gates_on_one_memory_broker_make_one_task_per_tick_quietly(clock, caplog):
    caplog.set_level(logging.DEBUG, logger="taskgate")
    broker = MemoryBroker(clock=clock)
    schedule = Schedule("every10s", "*/10 * * * * *", "q", catch_up=True)
    gates = [probed(make_gate(broker, QUEUES, schedules=[schedule])) for _ in range(2)]
    clock.set(at(2030, 1, 1, 0, 0, 5))
    async with gates[0], gates[1]:
        for _ in range(12):  # two minutes, ten seconds at a time
            clock.advance(10)
            for gate in gates:
                await looked(gate, clock)
    expected = [at(2030, 1, 1, 0, 0, 0) + timedelta(seconds=10 * n) for n in range(13)]
    assert await ticks(gates[0], "every10s") == iso(*expected)
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert any("submitted by another gate" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize(("catch_up", "hours"), [(False, [10, 13]), (True, [10, 11, 12, 13])])
async def test_a_running_gate_that_falls_behind_applies_the_same_rule(gate_broker, clock, catch_up, hours):
    clock.set(at(2030, 1, 1, 10, 20))
    gate = probed(
        make_gate(gate_broker, QUEUES, schedules=[Schedule("h", "0 * * * *", "q", catch_up=catch_up)])
    )
    async with gate:
        await looked(gate, clock)
        clock.advance(timedelta(hours=3))  # no look in between: the loop fell behind
        await looked(gate, clock)
    assert await ticks(gate, "h") == iso(*(at(2030, 1, 1, h) for h in hours))


async def test_a_schedule_added_while_running_ticks_and_its_tasks_run(gate_broker, clock):
    clock.set(at(2030, 1, 1, 9, 59, 30))
    gate = make_gate(gate_broker, QUEUES, routes={"report": "q"})
    ran: list[Any] = []
    gate.handle("report", lambda task: ran.append(task.json()))
    async with gate:
        schedule = gate.schedule("reports", "0 * * * *", "report", {"to": "ops"}, max_retry=2)
        assert schedule.submit_options == {"max_retry": 2}
        await until(lambda: _done(gate, "schedule:reports:2030-01-01T09:00:00+00:00"))
        clock.advance(30)
        await until(lambda: _done(gate, "schedule:reports:2030-01-01T10:00:00+00:00"))
    assert ran == [{"to": "ops"}, {"to": "ops"}]
    assert {t.max_retry for t in await gate.list(type="report")} == {2}


async def _done(gate: Gate, key: str) -> bool:
    found = await gate.history(key)
    return bool(found) and found[-1].status is Status.COMPLETED


async def test_a_gate_with_schedules_and_no_handlers_ticks_until_shut_down(gate_broker, clock):
    clock.set(at(2030, 1, 1, 10, 0, 30))
    gate = make_gate(gate_broker, QUEUES, schedules=[Schedule("m", "* * * * *", "q")])
    async with anyio.create_task_group() as tg:
        await tg.start(gate.run)
        await until(lambda: _exists(gate, "schedule:m:2030-01-01T10:00:00+00:00"))
        clock.advance(60)
        await until(lambda: _exists(gate, "schedule:m:2030-01-01T10:01:00+00:00"))
        with anyio.fail_after(GUARD):
            await gate.shutdown()
    assert await ticks(gate, "m") == iso(at(2030, 1, 1, 10, 0), at(2030, 1, 1, 10, 1))


async def test_hourly_and_daily_ticks_across_berlin_s_dst_changes(gate_broker, clock):
    hourly = Schedule("hourly", "0 * * * *", "q", timezone="Europe/Berlin", catch_up=True)
    daily = Schedule("daily", "30 2 * * *", "q", timezone="Europe/Berlin", catch_up=True)
    clock.set(at(2030, 3, 29, 12))
    await run_once(gate_broker, clock, daily)
    clock.set(at(2030, 4, 1, 12))  # across spring forward (2030-03-31)
    gate = await run_once(gate_broker, clock, daily)
    # 02:30 CET; 02:30 does not exist on the 31st: 03:00 CEST; 02:30 CEST.
    assert await ticks(gate, "daily") == iso(
        at(2030, 3, 29, 1, 30), at(2030, 3, 30, 1, 30), at(2030, 3, 31, 1), at(2030, 4, 1, 0, 30)
    )
    clock.set(at(2030, 10, 26, 22, 30))
    await run_once(gate_broker, clock, hourly)
    clock.set(at(2030, 10, 27, 2, 30))  # across fall back (2030-10-27, 03:00 CEST -> 02:00 CET)
    gate = await run_once(gate_broker, clock, hourly)
    # 00:00, 01:00, 02:00 CEST, 02:00 CET, 03:00 CET.
    assert await ticks(gate, "hourly") == iso(*(at(2030, 10, 26, 22) + timedelta(hours=n) for n in range(5)))


async def test_a_tick_older_than_its_tasks_retention_is_not_submitted(gate_broker, clock):
    kept = Retention(completed="1h", canceled="1h", failed="2h")
    clock.set(at(2030, 1, 1, 10, 20))
    daily = Schedule("daily", "0 6 * * *", "q", catch_up=True)
    gate = probed(make_gate(gate_broker, QUEUES, schedules=[daily], retention=kept))
    async with gate:
        await looked(gate, clock)  # 06:00 was 4h20m ago: its task may have been deleted
        assert await ticks(gate, "daily") == []
        clock.set(at(2030, 1, 2, 6, 0, 10))
        await looked(gate, clock)
    assert await ticks(gate, "daily") == iso(at(2030, 1, 2, 6))


async def test_a_walk_back_past_its_bound_submits_only_the_latest_tick(gate_broker, clock):
    schedule = Schedule("s", "* * * * * *", "q", catch_up=True)
    clock.set(at(2030, 1, 1, 10, 0, 0))
    await run_once(gate_broker, clock, schedule)
    clock.advance(5)
    await run_once(gate_broker, clock, schedule)
    clock.advance(1001)  # 1,001 ticks missed: more than the walk looks back
    gate = await run_once(gate_broker, clock, schedule)
    start = at(2030, 1, 1, 10)
    assert await ticks(gate, "s") == iso(
        *(start + timedelta(seconds=n) for n in range(6)), start + timedelta(seconds=1006)
    )


async def test_ticks_the_store_failed_to_look_up_or_store_are_tried_again(clock, caplog):
    inner = MemoryBroker(clock=clock)
    faulty = Faulty(inner)
    clock.set(at(2030, 1, 1, 10, 20))
    gate = make_gate(faulty, QUEUES, schedules=[Schedule("h", "0 * * * *", "q", catch_up=True)])
    faulty.failing["list"] = faulty.failing["submit"] = BrokerError("the store is down")
    async with gate:
        await until(lambda: _asked(faulty, "list", 2))  # the walk back's lookup, again
        del faulty.failing["list"]
        await until(lambda: _asked(faulty, "submit", 2))  # then the tick's submit, again
        del faulty.failing["submit"]
        await until(lambda: _asked(faulty, "submit", 3))
    assert [t.business_key for t in inner.list(Filter())] == ["schedule:h:2030-01-01T10:00:00+00:00"]
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any("the store is down" in message for message in warned), warned


async def _asked(faulty: Faulty, verb: str, times: int) -> bool:
    return faulty.calls.get(verb, 0) >= times


# -- bad input -------------------------------------------------------------------------------


def test_config_refuses_two_schedules_of_one_name_and_non_schedules(clock):
    broker = MemoryBroker(clock=clock)
    twice = [Schedule("s", "* * * * *", "q"), Schedule("s", "0 * * * *", "q")]
    with pytest.raises(ConfigError, match="names schedule 's' twice"):
        Config(broker=broker, queues=QUEUES, schedules=twice)
    with pytest.raises(ConfigError, match=r"not a taskgate\.Schedule"):
        Config(broker=broker, queues=QUEUES, schedules=["* * * * *"])  # type: ignore[list-item]


@pytest.mark.parametrize(
    ("options", "names"),
    [
        ({"type": "nowhere"}, "schedule 's': task type 'nowhere' goes to queue 'nowhere'"),
        ({"payload": object()}, "schedule 's': payload"),
        ({"max_retry": -1}, "schedule 's': max_retry must be >= 0"),
        ({"timeout": "soon"}, "schedule 's': .*timeout"),
        ({"depends_on": "abc"}, "schedule 's': depends_on"),
        ({"group": 5}, "schedule 's': group"),
        ({"priorty": 1}, "schedule 's': unknown submit option\\(s\\) priorty"),
    ],
)
def test_a_schedule_the_config_cannot_submit_is_refused_by_config_and_gate(clock, options, names):
    broker = MemoryBroker(clock=clock)
    args = {"type": "q", **options}
    task_type = args.pop("type")
    payload = args.pop("payload", None)
    with pytest.raises(ConfigError, match=names):
        Config(
            broker=broker, queues=QUEUES, schedules=[Schedule("s", "* * * * *", task_type, payload, **args)]
        )
    gate = make_gate(broker, QUEUES)
    with pytest.raises(ConfigError, match=names):
        gate.schedule("s", "* * * * *", task_type, payload, **args)
    assert gate.schedule("s", "* * * * *", "q").name == "s"  # nothing was registered


@pytest.mark.parametrize(
    ("args", "options", "names"),
    [
        (("s", "61 * * * *", "q"), {}, "invalid cron expression"),
        (("s", "* * * * *", "q"), {"timezone": "Europe/Atlantis"}, "unknown time zone 'Europe/Atlantis'"),
        (("s", "* * * * *", "q"), {"business_key": "mine"}, "business_key cannot be given"),
    ],
)
def test_gate_schedule_refuses_bad_arguments_registering_nothing(clock, args, options, names):
    gate = make_gate(MemoryBroker(clock=clock), QUEUES)
    with pytest.raises(ConfigError, match=names):
        gate.schedule(*args, **options)
    assert gate.schedule("s", "* * * * *", "q").name == "s"


def test_gate_schedule_refuses_a_name_scheduled_already(clock):
    broker = MemoryBroker(clock=clock)
    gate = make_gate(broker, QUEUES, schedules=[Schedule("from-config", "* * * * *", "q")])
    gate.schedule("added", "* * * * *", "q")
    for name in ("from-config", "added"):
        with pytest.raises(ConfigError, match=f"schedule named '{name}' exists already"):
            gate.schedule(name, "0 * * * *", "q")


async def test_refused_schedules_submit_nothing(gate_broker, clock):
    clock.set(at(2030, 1, 1, 10, 20))
    gate = make_gate(gate_broker, QUEUES)
    with pytest.raises(ConfigError):
        gate.schedule("bad", "* * * * *", "q", max_retry=-1)
    probed(gate)
    async with gate:
        await looked(gate, clock)
    assert [t.business_key for t in await gate.list()] == [
        tick_key(_probes[id(gate)], at(2030, 1, 1, 10, 20))
    ]
