"""What is particular to RedisBroker: key layout, scripts, server clock, shared limits, and how
each verb maps to its scripts.

The broker behaviour itself is the contract suite's (tests/contract/test_redis.py). Tests use
a random key prefix on the shared Redis and delete their keys afterwards.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from importlib import resources
from pathlib import Path
from typing import Any, cast

import pytest
import redis
from helpers.redis_servers import RedisServer, free_port, purge_keys
from redis.crc import key_slot

from taskgate.brokers.base import FailureKind, Lease, NewTask, QuotaSpec
from taskgate.brokers.params import (
    Canceled,
    Claim,
    Claimed,
    Complete,
    Fail,
    Finish,
    GiveBack,
    Heartbeat,
    QueueQuery,
    Requeue,
    Retry,
    Settle,
    SharedLimits,
    Submit,
    Submitted,
)
from taskgate.brokers.redis import RedisBroker, scripts
from taskgate.brokers.redis.codec import NEW_TASK_FIELDS, SNAPSHOT_FIELDS, enqueue_args, from_us
from taskgate.brokers.redis.keys import KeySpace
from taskgate.brokers.redis.scripts import CHAINED, SCRIPT_NAMES, ScriptBook, function_library
from taskgate.brokers.redis.waiter import SLICE
from taskgate.brokers.split import SplitCaller
from taskgate.clock import ManualClock
from taskgate.errors import BrokerError, ConfigError, LeaseLostError, TaskNotFoundError
from taskgate.task import Filter, Status, Task
from taskgate.testing import steps

TTL = timedelta(seconds=10)

Factory = Callable[..., RedisBroker]


@pytest.fixture
def open_broker(redis_url: str, unique_prefix: str, client: redis.Redis) -> Iterator[Factory]:
    """Opens brokers on this test's prefix (keyword options pass through); cleans up after."""
    opened: list[RedisBroker] = []

    def make(**options: object) -> RedisBroker:
        broker = RedisBroker(redis_url, key_prefix=unique_prefix, **options)  # type: ignore[arg-type]
        opened.append(broker)
        return broker

    yield make
    for broker in opened:
        broker.close()
    purge_keys(client, KeySpace(unique_prefix).pattern())


def _server_us(client: redis.Redis) -> int:
    seconds, micros = client.time()
    return int(seconds) * 1_000_000 + int(micros)


# -- configuration and key layout ---------------------------------------------------------


@pytest.mark.parametrize("prefix", ["", "a b", "x{y}:", "x}", "a*", ":::", "é:", "a" * 65, None, 7])
def test_an_unusable_key_prefix_is_refused(redis_url: str, prefix: object) -> None:
    with pytest.raises(ConfigError, match="key_prefix"):
        RedisBroker(redis_url, key_prefix=prefix)  # type: ignore[arg-type]


def test_the_default_prefix_gives_hash_tagged_keys() -> None:
    keys = KeySpace()
    assert keys.base == "tg:{tg}:"
    assert keys.task("01J") == "tg:{tg}:task:01J"
    assert keys.queue("llm") == "tg:{tg}:queue:llm"


def test_every_key_a_workload_creates_lives_under_the_base_in_one_slot(
    open_broker: Factory, client: redis.Redis, unique_prefix: str
) -> None:
    broker = open_broker()
    steps.enqueue(
        broker,
        [
            NewTask(id="p", type="t", queue="q", business_key="k", payload=b"x"),
            NewTask(id="c", type="t", queue="q", depends_on=("p",)),
            NewTask(id="x", type="t", queue="q"),
        ],
    )
    (lease,) = steps.claim(broker, "q", 1, TTL)
    steps.fail(broker, "p", lease.token, kind=FailureKind.BUSINESS, error="no")
    steps.replay(broker, "p", new_id="p2")
    quota = QuotaSpec("budget", 5, timedelta(hours=1))
    broker.claim(Claim("q", 1, TTL, quota=quota, shared=SharedLimits(workers=1, rps=2, claimer="a")))
    broker.claim(Claim("q", 1, TTL, shared=SharedLimits(workers=1, claimer="b")))  # b waits
    steps.enqueue(broker, [NewTask(id="g", type="t", queue="gq", group="tenant")])
    every_group_limit = SharedLimits(
        workers=2, group_workers=1, group_rps=1, group_quota_limit=5, group_quota_period=timedelta(hours=1)
    )
    assert _ids(broker.claim(Claim("gq", 1, TTL, shared=every_group_limit))) == ["g"]

    keys = KeySpace(unique_prefix)
    everything = [k.decode() for k in client.scan_iter(match=f"*{unique_prefix}*")]
    assert len(everything) >= 12
    assert all(k.startswith(keys.base) for k in everything), everything
    assert {key_slot(k.encode()) for k in everything} == {key_slot(keys.base.encode())}


def test_a_client_that_decodes_responses_is_refused(redis_url: str) -> None:
    decoding = redis.Redis.from_url(redis_url, decode_responses=True)
    try:
        with pytest.raises(ConfigError, match="decode_responses"):
            RedisBroker(decoding)
    finally:
        decoding.close()


def test_closing_the_broker_leaves_a_callers_client_open(redis_url: str, unique_prefix: str) -> None:
    own = redis.Redis.from_url(redis_url)
    try:
        broker = RedisBroker(own, key_prefix=unique_prefix)
        broker.close()
        assert own.ping() is True
        with pytest.raises(BrokerError, match="closed"):
            steps.queue_length(broker, "q")
    finally:
        own.close()


@pytest.mark.parametrize("bad", [0, -1.0, float("nan"), "5", True])
def test_a_bad_socket_timeout_is_refused(redis_url: str, bad: object) -> None:
    with pytest.raises(ConfigError, match="socket_timeout"):
        RedisBroker(redis_url, socket_timeout=bad)  # type: ignore[arg-type]


# -- the scripts ----------------------------------------------------------------------------


def _lua_dir() -> Path:
    return Path(str(resources.files("taskgate.brokers.redis") / "lua"))


@pytest.mark.parametrize("name", SCRIPT_NAMES)
def test_each_script_file_documents_keys_argv_return_and_touched_keys(name: str) -> None:
    header = (_lua_dir() / f"{name}.lua").read_text().split("\n\n")[0]
    for part in ("KEYS[1]", "ARGV[1]", "Returns", "Touches"):
        assert part in header, f"{name}.lua header lacks {part}"


def test_no_python_module_of_the_broker_embeds_lua() -> None:
    package = _lua_dir().parent
    for module in package.glob("*.py"):
        assert not re.search(r"redis\.p?call\(|\blocal function\b", module.read_text()), module.name


def _library_loaded(client: redis.Redis) -> bool:
    return bool(client.function_list(library=function_library().name))


# The library is the server's: deleting it on the shared one would pull it from under the tests
# running beside these.
def test_the_scripts_survive_their_library_being_deleted(private_redis: RedisServer) -> None:
    broker = RedisBroker(private_redis.url, clock=ManualClock())
    client = redis.Redis.from_url(private_redis.url)
    try:
        steps.enqueue(broker, [NewTask(id="a", type="t", queue="q")])
        # As after a restart of a server without persistence: the next FCALL finds no function.
        client.function_delete(function_library().name)
        assert [lease.task.id for lease in steps.claim(broker, "q", 1, TTL)] == ["a"]
    finally:
        broker.close()
        client.close()


def test_a_library_another_process_loaded_is_used_as_it_is(private_redis: RedisServer) -> None:
    client = redis.Redis.from_url(private_redis.url)
    broker = RedisBroker(private_redis.url, clock=ManualClock())
    try:
        assert not _library_loaded(client)
        ScriptBook(client).load()
        ScriptBook(client).load()  # a second process loading it at the same time
        assert steps.enqueue(broker, [NewTask(id="a", type="t", queue="q")])[0].status is Status.PENDING
        assert _library_loaded(client)
    finally:
        broker.close()
        client.close()


def test_the_library_registers_every_script_under_its_own_name(client: redis.Redis) -> None:
    library = function_library()
    ScriptBook(client).load()
    (listed,) = client.function_list(library=library.name)
    listed = {key.decode(): value for key, value in zip(listed[::2], listed[1::2], strict=True)}
    functions = {
        {key.decode(): value for key, value in zip(f[::2], f[1::2], strict=True)}["name"].decode()
        for f in listed["functions"]
    }
    # Names carry the library's version: two taskgate versions on one server never clash.
    assert functions == {library.function(name) for name in (*SCRIPT_NAMES, *CHAINED)}
    assert library.name.startswith("taskgate_") and library.name != "taskgate_"


def test_a_call_that_raised_leaves_none_of_its_deferred_writes_to_the_next(
    open_broker: Factory, client: redis.Redis, unique_prefix: str
) -> None:
    broker = open_broker(clock=ManualClock())
    steps.enqueue(broker, [NewTask(id="a", type="t", queue="q")])
    (lease,) = steps.claim(broker, "q", 1, TTL)
    # The ack defers its counter and index moves, then raises reading a's children.
    client.set(KeySpace(unique_prefix).base + "children:a", "not a set")
    with pytest.raises(BrokerError, match="WRONGTYPE"):
        steps.ack(broker, "a", lease.token, None)
    before = broker.counts()
    steps.enqueue(broker, [NewTask(id="b", type="t", queue="other")])
    assert broker.counts() == {"t": {**before["t"], Status.PENDING: before["t"].get(Status.PENDING, 0) + 1}}


def test_a_change_of_any_script_makes_another_library(monkeypatch: pytest.MonkeyPatch) -> None:
    before = function_library()
    original = scripts.read_lua
    monkeypatch.setattr(scripts, "read_lua", lambda name: original(name) + ("\n" if name == "reap" else ""))
    after = function_library()
    assert after.name != before.name
    assert after.function("claim") != before.function("claim")


def test_what_one_call_sets_is_not_seen_by_the_next(
    open_broker: Factory, redis_url: str, unique_prefix: str, client: redis.Redis
) -> None:
    # The library outlives its calls: base key, clock and deferred writes are set by each call.
    start = datetime(2026, 1, 1, tzinfo=UTC)
    manual = open_broker(clock=ManualClock(start))
    other = RedisBroker(redis_url, key_prefix=unique_prefix + "o")
    try:
        for n in range(3):
            (mine,) = steps.enqueue(manual, [NewTask(id=f"m{n}", type="t", queue="q")])
            (theirs,) = steps.enqueue(other, [NewTask(id=f"o{n}", type="t", queue="q")])
            assert mine.created_at == start
            assert abs(theirs.created_at - datetime.now(UTC)) < timedelta(minutes=5)
        assert [lease.task.id for lease in steps.claim(manual, "q", 10, TTL)] == ["m0", "m1", "m2"]
        assert manual.counts() == {"t": {Status.RUNNING: 3}}
        assert other.counts() == {"t": {Status.PENDING: 3}}
    finally:
        other.close()
        purge_keys(client, KeySpace(unique_prefix + "o").pattern())


# -- time: the server's clock unless one is injected ---------------------------------------


def test_without_a_clock_times_come_from_redis_time(open_broker: Factory, client: redis.Redis) -> None:
    broker = open_broker()
    before = _server_us(client)
    (task,) = steps.enqueue(broker, [NewTask(id="a", type="t", queue="q", delay=timedelta(seconds=5))])
    after = _server_us(client)
    assert from_us(before) <= task.created_at <= from_us(after)
    assert task.run_at - task.created_at == timedelta(seconds=5)


def test_without_a_clock_quota_windows_are_epoch_aligned_on_the_server(
    open_broker: Factory, client: redis.Redis
) -> None:
    broker = open_broker()
    steps.enqueue(broker, [NewTask(id=f"t{n}", type="t", queue="q") for n in range(5)])
    grant = broker.claim(Claim("q", 5, TTL, quota=QuotaSpec("budget", 3, timedelta(minutes=1)))).quota
    now = from_us(_server_us(client))
    assert grant is not None and grant.window_start <= now < grant.window_end
    assert (grant.window_start.second, grant.window_start.microsecond, grant.granted) == (0, 0, 3)


# -- the operator's view: counters and lengths, no scans -----------------------------------


def test_counts_are_the_stats_hash_and_queue_length_the_queue_zset(
    open_broker: Factory, client: redis.Redis, unique_prefix: str
) -> None:
    broker = open_broker(clock=ManualClock())
    steps.enqueue(broker, [NewTask(id=f"t{i}", type="a", queue="q") for i in range(3)])
    steps.enqueue(broker, [NewTask(id="b", type="b", queue="q", delay=timedelta(hours=1))])
    steps.claim(broker, "q", 1, TTL)
    keys = KeySpace(unique_prefix)
    raw = client.hgetall(keys.stats())
    stats = {str(k, "utf-8") if isinstance(k, bytes) else k: int(v) for k, v in raw.items()}
    assert {k: v for k, v in stats.items() if v} == {"pending:a": 2, "running:a": 1, "pending:b": 1}
    assert broker.counts() == {"a": {Status.PENDING: 2, Status.RUNNING: 1}, "b": {Status.PENDING: 1}}
    assert steps.queue_length(broker, "q") == client.zcard(keys.queue("q")) == 3


def test_queue_state_reads_the_quota_hash_as_claims_left_it(
    open_broker: Factory, client: redis.Redis, unique_prefix: str
) -> None:
    broker = open_broker(clock=ManualClock())
    spec = QuotaSpec("llm", 5, timedelta(hours=1))
    steps.enqueue(broker, [NewTask(id=f"t{i}", type="a", queue="q") for i in range(3)])
    broker.claim(Claim("q", 2, TTL, quota=spec))
    stored = client.hgetall(f"{KeySpace(unique_prefix).base}quota:llm")
    state = broker.queue_state(QueueQuery("q", spec))
    assert state.queue_len == 1 and state.quota is not None
    assert (state.quota.used, state.quota.window_start) == (int(stored[b"used"]), from_us(stored[b"start"]))


def _stored(client: redis.Redis, unique_prefix: str, task_id: str) -> dict[bytes, bytes]:
    return cast("dict[bytes, bytes]", client.hgetall(KeySpace(unique_prefix).task(task_id)))


def test_a_batch_sharing_its_fields_is_sent_once_per_field_and_stored_task_by_task(
    open_broker: Factory, client: redis.Redis, unique_prefix: str
) -> None:
    broker = open_broker(clock=ManualClock())
    steps.enqueue(broker, [NewTask(id="parent", type="p", queue="p")])
    options = {
        "type": "a",
        "queue": "q",
        "max_retry": 7,
        "delay": timedelta(seconds=5),
        "timeout": timedelta(milliseconds=1500),
    }
    shared = [
        NewTask(id=f"s{n}", payload=payload, depends_on=("parent",), **options)  # type: ignore[arg-type]
        for n, payload in enumerate([None, b"", b"x"])
    ]
    one_by_one = [
        NewTask(id=f"r{n}", payload=payload, depends_on=("parent",), **options)  # type: ignore[arg-type]
        for n, payload in enumerate([None, b"", b"x"])
    ]
    assert enqueue_args(shared)[1] == "shared" and len(enqueue_args(shared)) == 2 + NEW_TASK_FIELDS + 3 * 3
    snapshots = steps.enqueue(broker, shared)
    for task in one_by_one:
        steps.enqueue(broker, [task])  # one task: the "rows" shape
    for n in range(3):
        by_shape = [_stored(client, unique_prefix, f"{shape}{n}") for shape in "sr"]
        by_shape[0].pop(b"id"), by_shape[1].pop(b"id")
        assert by_shape[0] == by_shape[1]
        assert broker.get(f"s{n}") == snapshots[n]
    assert [t.payload for t in snapshots] == [None, b"", b"x"]
    assert {t.status for t in snapshots} == {Status.BLOCKED}
    assert {t.timeout for t in snapshots} == {timedelta(milliseconds=1500)}


@pytest.mark.parametrize(
    "timing",
    [
        {},
        {"delay": timedelta(seconds=5)},
        {"run_at": datetime(2031, 1, 1, tzinfo=UTC)},
        {"timeout": timedelta(seconds=30)},
    ],
    ids=["now", "delay", "run_at", "timeout"],
)
def test_plain_tasks_are_stored_as_the_general_path_stores_them(
    open_broker: Factory, client: redis.Redis, unique_prefix: str, timing: dict[str, object]
) -> None:
    # enqueue.lua stores a shared batch without parents, and one task alone without parents
    # or business key, on a path of its own: hashes, every set, counters as the general
    # path (here: a batch whose tasks differ in type) stores them.
    broker = open_broker(clock=ManualClock())
    options: dict[str, Any] = {
        "type": "a",
        "queue": "q",
        "max_retry": 7,
        "ignore_parent_failure": True,
        **timing,
    }
    payloads = [None, b"", b"x"]
    shared = [NewTask(id=f"s{n}", payload=p, **options) for n, p in enumerate(payloads)]
    assert enqueue_args(shared)[1] == "shared"
    snapshots = steps.enqueue(broker, shared)
    alone = [
        steps.enqueue(broker, [NewTask(id=f"a{n}", payload=p, **options)])[0] for n, p in enumerate(payloads)
    ]
    for n, payload in enumerate(payloads):
        general = [
            NewTask(id=f"r{n}", payload=payload, **options),
            NewTask(id=f"o{n}", type="other", queue="o"),
        ]
        assert enqueue_args(general)[1] == "rows"
        steps.enqueue(broker, general)
    base = KeySpace(unique_prefix).base
    names = ("idx:all", "idx:type:a", "idx:queue:q", "idx:status:pending", "queue:q")
    sets = [f"{base}{name}" for name in names]
    for n in range(3):
        reference = _stored(client, unique_prefix, f"r{n}")
        assert reference.pop(b"id") == f"r{n}".encode()
        for path in "sa":
            stored = _stored(client, unique_prefix, f"{path}{n}")
            assert stored.pop(b"id") == f"{path}{n}".encode()
            assert stored == reference, path
            for key in sets:
                assert client.zscore(key, f"{path}{n}") == client.zscore(key, f"r{n}") is not None, key
        assert broker.get(f"s{n}") == snapshots[n] and broker.get(f"a{n}") == alone[n]
    assert [t.payload for t in snapshots] == [t.payload for t in alone] == payloads
    assert {t.timeout for t in [*snapshots, *alone]} == {timing.get("timeout")}
    assert {t.status for t in [*snapshots, *alone]} == {Status.PENDING}
    assert broker.counts()["a"] == {Status.PENDING: 9}


def test_a_shared_batch_with_an_id_in_use_stores_nothing(open_broker: Factory, client: redis.Redis) -> None:
    broker = open_broker()
    steps.enqueue(broker, [NewTask(id="taken", type="a", queue="q")])
    for ids in (["new1", "taken", "new2"], ["new1", "new2", "new1"]):
        batch = [NewTask(id=task_id, type="a", queue="q") for task_id in ids]
        assert enqueue_args(batch)[1] == "shared"
        with pytest.raises(ValueError, match="taken" if "taken" in ids else "new1"):
            steps.enqueue(broker, batch)
        assert steps.queue_length(broker, "q") == 1 and broker.counts() == {"a": {Status.PENDING: 1}}


def test_a_batch_that_differs_in_more_than_ids_and_payloads_goes_row_by_row() -> None:
    tasks = [NewTask(id="a", type="t", queue="q"), NewTask(id="b", type="t", queue="q", max_retry=9)]
    assert enqueue_args(tasks)[1] == "rows"
    timed = [NewTask(id="a", type="t", queue="q"), NewTask(id="b", type="t", queue="q", timeout=timedelta(1))]
    assert enqueue_args(timed)[1] == "rows"
    keyed = [NewTask(id=f"k{n}", type="t", queue="q", business_key=f"key{n}") for n in range(2)]
    assert enqueue_args(keyed)[1] == "rows"


# -- shared limits (on an injected clock) -----------------------------------------------------


def test_the_broker_declares_what_it_shares_and_how_it_is_called(open_broker: Factory) -> None:
    broker = open_broker()
    capabilities = broker.capabilities
    assert capabilities.shared_limits and capabilities.shared_quota and capabilities.group_limits
    assert capabilities.cross_process and capabilities.push_wakeups
    assert capabilities.acks_in_claims and capabilities.split_calls
    assert isinstance(broker, SplitCaller)  # the protocol itself: the contract's surface tests


def _pending(broker: RedisBroker, n: int, queue: str = "q", *, first: int = 0) -> list[str]:
    """``n`` due tasks of ``queue``, ids ``t<first>`` on."""
    ids = [f"t{i}" for i in range(first, first + n)]
    steps.enqueue(broker, [NewTask(id=task_id, type="t", queue=queue) for task_id in ids])
    return ids


def _limited(
    broker: RedisBroker,
    workers: int,
    limit: int,
    lease_ttl: timedelta = TTL,
    *,
    queue: str = "q",
    quota: QuotaSpec | None = None,
    acks: tuple[Complete, ...] = (),
    **shared: Any,
) -> Claimed:
    """A claim of ``queue`` under shared limits (``shared``: the other `SharedLimits` fields)."""
    limits = SharedLimits(workers=workers, **shared)
    return broker.claim(Claim(queue, limit, lease_ttl, quota=quota, shared=limits, acks=acks))


def _ids(taken: Claimed) -> list[str]:
    return [lease.task.id for lease in taken.leases]


def _slots_held(client: redis.Redis, unique_prefix: str, queue: str = "q") -> set[str]:
    tokens = cast("list[bytes]", client.zrange(KeySpace(unique_prefix).slots(queue), 0, -1))
    return {token.decode() for token in tokens}


def _give_back_slots(broker: RedisBroker, tokens: list[str], queue: str = "q") -> None:
    assert broker.settle(Settle(give_back=GiveBack(queue=queue, slots=tuple(tokens)))) == []


def test_slot_capacity_is_shared_by_every_broker_object(open_broker: Factory) -> None:
    clock = ManualClock()
    one, two = open_broker(clock=clock), open_broker(clock=clock)
    _pending(one, 5)
    _pending(one, 1, "other", first=5)
    assert (len(_limited(one, 3, 2).leases), len(_limited(two, 3, 2).leases)) == (2, 1)
    assert _limited(one, 3, 1).leases == []
    assert _ids(_limited(two, 3, 1, queue="other")) == ["t5"]


def test_a_heartbeat_renews_the_lease_s_slot_and_reports_one_that_expired(
    open_broker: Factory, client: redis.Redis, unique_prefix: str
) -> None:
    clock = ManualClock()
    broker = open_broker(clock=clock)
    _pending(broker, 3)
    (kept,) = _limited(broker, 2, 1).leases
    (lapsed,) = _limited(broker, 2, 1, TTL / 2).leases
    clock.advance(TTL / 2)
    renewal = broker.heartbeat(Heartbeat(kept.task.id, kept.token, TTL, slot_queue="q"))
    assert (renewal.expires_at, renewal.cancel_requested, renewal.slot_lost) == (
        clock.now() + TTL,
        False,
        False,
    )
    # The lapsed lease, not reaped yet, is still held; its slot is not (another may have it).
    renewal = broker.heartbeat(Heartbeat(lapsed.task.id, lapsed.token, TTL, slot_queue="q"))
    assert (renewal.expires_at, renewal.slot_lost) == (clock.now() + TTL, True)
    assert _slots_held(client, unique_prefix) == {kept.token}  # the lost slot was dropped
    clock.advance(TTL - timedelta(microseconds=1))
    assert _ids(_limited(broker, 2, 2)) == ["t2"]  # `kept` still holds its renewed slot


def test_a_heartbeat_of_a_lost_lease_renews_no_slot(
    open_broker: Factory, client: redis.Redis, unique_prefix: str
) -> None:
    clock = ManualClock()
    broker = open_broker(clock=clock)
    _pending(broker, 1)
    (lease,) = _limited(broker, 1, 1).leases
    expiry = client.zscore(KeySpace(unique_prefix).slots("q"), lease.token)
    clock.advance(1)
    with pytest.raises(LeaseLostError):
        broker.heartbeat(Heartbeat(lease.task.id, "stale", TTL, slot_queue="q"))
    assert client.zscore(KeySpace(unique_prefix).slots("q"), lease.token) == expiry


def test_a_slot_is_given_back_at_most_once(open_broker: Factory) -> None:
    broker = open_broker(clock=ManualClock())
    _pending(broker, 3)
    (mine,) = _limited(broker, 1, 1).leases
    _give_back_slots(broker, [mine.token])
    (theirs,) = _limited(broker, 1, 1).leases
    _give_back_slots(broker, [mine.token])  # late duplicate: must not free `theirs`
    assert _limited(broker, 1, 1).leases == []
    assert broker.heartbeat(Heartbeat(theirs.task.id, theirs.token, TTL, slot_queue="q")).slot_lost is False


def test_a_limited_claim_takes_a_slot_per_claimed_task_and_no_more(open_broker: Factory) -> None:
    clock = ManualClock()
    one, two = open_broker(clock=clock), open_broker(clock=clock)
    _pending(one, 5)
    (other,) = _limited(two, 4, 1).leases  # another process's slot
    leases = _limited(one, 4, 10).leases
    assert [lease.task.id for lease in leases] == ["t1", "t2", "t3"]  # 4 slots, 1 held elsewhere
    assert all(lease.task.status is Status.RUNNING for lease in leases)
    assert _limited(two, 4, 10).leases == []  # every slot is held
    assert two.get("t4").status is Status.PENDING  # nothing claimed without a slot
    # Each lease's token is its slot: renewing and giving back work by that token.
    for lease in [*leases, other]:
        assert not one.heartbeat(Heartbeat(lease.task.id, lease.token, TTL, slot_queue="q")).slot_lost
    _give_back_slots(one, [leases[0].token])
    assert _ids(_limited(two, 4, 10)) == ["t4"]


def test_a_limited_claim_takes_no_slot_when_nothing_is_due(
    open_broker: Factory, client: redis.Redis, unique_prefix: str
) -> None:
    broker = open_broker(clock=ManualClock())
    assert _limited(broker, 2, 2).leases == []
    assert _slots_held(client, unique_prefix) == set()


def test_a_grouped_claim_looks_at_2000_due_tasks_at_most(open_broker: Factory) -> None:
    broker = open_broker(clock=ManualClock())
    ahead = [NewTask(id=f"a{i:04}", type="t", queue="q", group="a") for i in range(2001)]
    for first in range(0, len(ahead), 500):
        steps.enqueue(broker, ahead[first : first + 500])
    steps.enqueue(broker, [NewTask(id="b", type="t", queue="q", group="b")])
    # a is full after its first task; b is the 2002nd candidate: past the walk's cap.
    assert _ids(_limited(broker, 10, 10, group_workers=1)) == ["a0000"]
    assert _ids(_limited(broker, 10, 10, group_workers=1)) == []
    assert broker.get("b").status is Status.PENDING
    assert _ids(_limited(broker, 10, 10, group_workers=2)) == ["a0001"]  # a has room again


def test_the_map_of_slots_to_groups_is_pruned_as_slots_go(
    open_broker: Factory, client: redis.Redis, unique_prefix: str
) -> None:
    broker = open_broker(clock=ManualClock())
    steps.enqueue(broker, [NewTask(id=f"t{i}", type="t", queue="q", group=f"g{i % 7}") for i in range(300)])
    for _ in range(150):
        taken = _limited(broker, 4, 2, group_workers=1).leases
        _give_back_slots(broker, [lease.token for lease in taken])
    # Each claim maps its two slots; given back at once, their entries wait for a prune.
    assert client.hlen(KeySpace(unique_prefix).slot_groups("q")) <= 64 + 2


def test_a_limited_claims_slots_expire_with_the_lease(open_broker: Factory) -> None:
    clock = ManualClock()
    broker = open_broker(clock=clock)
    _pending(broker, 2)
    (lease,) = _limited(broker, 1, 1).leases
    assert lease.expires_at == clock.now() + TTL
    clock.advance(TTL - timedelta(microseconds=1))
    assert _limited(broker, 1, 1).leases == []
    clock.advance(timedelta(microseconds=1))  # the crashed holder's slot comes back
    assert _ids(_limited(broker, 1, 1)) == ["t1"]


def test_a_limited_claim_spends_starts_only_for_tasks_claimed(open_broker: Factory) -> None:
    broker = open_broker(clock=ManualClock())
    _pending(broker, 2)
    # 10 free slots, burst 3 at 2/s, but only 2 tasks due: 2 starts spent, no wait.
    taken = _limited(broker, 10, 10, rps=2.0, burst=3)
    assert (_ids(taken), taken.retry_after) == (["t0", "t1"], 0.0)
    _pending(broker, 5, first=2)
    taken = _limited(broker, 10, 5, rps=2.0, burst=3)  # the third start of the burst is left
    assert (_ids(taken), taken.retry_after) == (["t2"], 0.5)


def test_a_limited_claim_holds_tasks_back_by_the_rate_and_says_how_long(
    open_broker: Factory, client: redis.Redis, unique_prefix: str
) -> None:
    clock = ManualClock()
    broker = open_broker(clock=clock)
    _pending(broker, 5)
    taken = _limited(broker, 10, 10, rps=2.0, burst=3)
    assert (_ids(taken), taken.retry_after) == (["t0", "t1", "t2"], 0.5)
    assert _limited(broker, 10, 10, rps=2.0, burst=3) == Claimed(leases=[], retry_after=0.5)
    assert broker.get("t3").status is Status.PENDING
    # The rate held t3 back, not a slot: only the three claimed tasks hold slots.
    assert len(_slots_held(client, unique_prefix)) == 3
    clock.advance(0.5)
    taken = _limited(broker, 20, 10, rps=2.0, burst=3)
    assert (_ids(taken), taken.retry_after) == (["t3"], 0.5)


def test_a_limited_claim_takes_no_start_without_a_free_slot(open_broker: Factory) -> None:
    broker = open_broker(clock=ManualClock())
    _pending(broker, 2)
    (held,) = _limited(broker, 1, 1).leases
    assert _limited(broker, 1, 5, rps=1.0, burst=1) == Claimed(leases=[], retry_after=0.0)
    _give_back_slots(broker, [held.token])
    # The refused claim spent no start: the one start of the burst is still there.
    taken = _limited(broker, 1, 5, rps=1.0, burst=1)
    assert (_ids(taken), taken.retry_after) == (["t1"], 0.0)


def test_a_limited_claim_spends_quota_units_only_for_tasks_claimed(open_broker: Factory) -> None:
    broker = open_broker(clock=ManualClock())
    _pending(broker, 3)
    quota = QuotaSpec("api", 5, timedelta(minutes=1))
    taken = _limited(broker, 10, 10, quota=quota)
    assert _ids(taken) == ["t0", "t1", "t2"]
    assert taken.quota is not None and (taken.quota.granted, taken.exhausted) == (3, False)
    _pending(broker, 5, "other", first=3)
    again = broker.claim(Claim("other", 5, TTL, quota=quota))
    assert again.quota is not None and again.quota.granted == 2  # 3 of 5 spent


def test_a_limited_claim_stops_at_the_quota_and_says_the_window_ran_out(
    open_broker: Factory, client: redis.Redis, unique_prefix: str
) -> None:
    clock = ManualClock()
    broker = open_broker(clock=clock)
    _pending(broker, 4)
    quota = QuotaSpec("api", 2, timedelta(minutes=1))
    assert _ids(_limited(broker, 10, 10, quota=quota)) == ["t0", "t1"]
    empty = _limited(broker, 10, 10, quota=quota)
    assert empty.leases == [] and empty.quota is not None and empty.exhausted
    assert len(_slots_held(client, unique_prefix)) == 2  # the refused claim held no slot
    clock.advance(60)  # the next window
    assert _ids(_limited(broker, 20, 10, quota=quota)) == ["t2", "t3"]


def test_gcra_grants_the_burst_then_the_rate(open_broker: Factory) -> None:
    clock = ManualClock()
    broker = open_broker(clock=clock)
    _pending(broker, 20)

    def starts(n: int) -> tuple[int, float]:
        taken = _limited(broker, 100, n, rps=2.0, burst=3)
        return len(taken.leases), taken.retry_after

    assert starts(5) == (3, 0.5)
    assert starts(1) == (0, 0.5)
    clock.advance(0.5)
    assert starts(2) == (1, 0.5)
    clock.advance(10)
    assert starts(9)[0] == 3


def test_gcra_defaults_and_unlimited_rate(open_broker: Factory) -> None:
    broker = open_broker(clock=ManualClock())
    for first, queue in enumerate("qrs"):
        _pending(broker, 10, queue, first=10 * first)
    assert len(_limited(broker, 100, 10).leases) == 10  # rps 0: no rate
    assert len(_limited(broker, 100, 10, queue="r", rps=4.5).leases) == 4  # burst 0: max(1, int(rps))
    taken = _limited(broker, 100, 3, queue="s", rps=0.5)
    assert (len(taken.leases), taken.retry_after) == (1, 2.0)


def test_quota_fails_closed_when_redis_is_unreachable() -> None:
    broker = RedisBroker(f"redis://127.0.0.1:{free_port()}/0", socket_timeout=0.5)
    try:
        with pytest.raises(BrokerError):
            broker.claim(Claim("q", 1, TTL, quota=QuotaSpec("budget", 10, timedelta(hours=1))))
    finally:
        broker.close()


def test_quota_units_given_back_go_to_their_window_only(open_broker: Factory) -> None:
    clock = ManualClock()
    broker = open_broker(clock=clock)
    _pending(broker, 5)
    quota = QuotaSpec("api", 2, timedelta(minutes=1))
    first = broker.claim(Claim("q", 2, TTL, quota=quota))
    assert first.quota is not None and first.quota.granted == 2
    (lease, _) = first.leases
    # One task of the grant never ran: its unit goes back with its requeue, after it.
    answers = broker.settle(
        Settle((Requeue(lease.task.id, lease.token),), give_back=GiveBack(quota=((first.quota, 1),)))
    )
    assert [answer.status for answer in answers] == [Status.PENDING]  # type: ignore[union-attr]
    assert _ids(broker.claim(Claim("q", 5, TTL, quota=quota))) == ["t0"]
    clock.advance(60)  # a window later: units given back to the old window change nothing
    assert len(broker.claim(Claim("q", 1, TTL, quota=quota)).leases) == 1
    broker.settle(Settle(give_back=GiveBack(quota=((first.quota, 2),))))
    assert len(broker.claim(Claim("q", 5, TTL, quota=quota)).leases) == 1


def test_without_a_claimer_id_a_claim_takes_every_free_slot(open_broker: Factory) -> None:
    broker = open_broker(clock=ManualClock())
    _pending(broker, 3)
    (held,) = _limited(broker, 1, 1).leases
    assert _ids(_limited(broker, 1, 1, claimer="b")) == []
    assert _ids(_limited(broker, 1, 1, release=(held.token,))) == ["t1"]


def test_a_limited_claim_gives_the_released_slots_back_before_counting_free_ones(
    open_broker: Factory, client: redis.Redis, unique_prefix: str
) -> None:
    broker = open_broker(clock=ManualClock())
    _pending(broker, 4)
    first = _limited(broker, 2, 2)
    assert _ids(first) == ["t0", "t1"]
    assert _ids(_limited(broker, 2, 2)) == []  # both slots held
    done = tuple(lease.token for lease in first.leases)
    assert _ids(_limited(broker, 2, 2, release=done)) == ["t2", "t3"]
    held = _slots_held(client, unique_prefix)
    assert held.isdisjoint(done) and len(held) == 2


def test_claimers_take_turns_at_slots_given_back(open_broker: Factory) -> None:
    broker = open_broker(clock=ManualClock())
    _pending(broker, 4)
    (held,) = _limited(broker, 1, 1, claimer="a").leases
    assert _ids(_limited(broker, 1, 1, claimer="b")) == []  # b is owed a slot
    # a's task is done: its slot goes back, but is left for b instead of being taken again.
    assert _ids(_limited(broker, 1, 1, release=(held.token,), claimer="a")) == []
    (b_lease,) = _limited(broker, 1, 1, claimer="b").leases
    assert b_lease.task.id == "t1"
    # b got its turn and is struck off; a, which found no slot, is owed the next one.
    assert _ids(_limited(broker, 1, 1, release=(b_lease.token,), claimer="b")) == []
    assert _ids(_limited(broker, 1, 1, claimer="a")) == ["t2"]


def test_slots_given_back_and_left_to_a_waiter_wake_it_while_tasks_are_due(
    open_broker: Factory, client: redis.Redis, unique_prefix: str
) -> None:
    broker = open_broker(clock=ManualClock())
    _pending(broker, 2)
    signals = client.pubsub()
    signals.subscribe(KeySpace(unique_prefix).signal("q"))
    try:
        # Read the confirmation first: the "no message" checks below must not pass on it.
        confirmed = signals.get_message(timeout=5)
        assert confirmed is not None and confirmed["type"] == "subscribe"
        (held,) = _limited(broker, 1, 1, claimer="a").leases
        assert _ids(_limited(broker, 1, 1, claimer="b")) == []  # b is owed
        assert signals.get_message(timeout=0.2) is None  # no slot was given back
        assert _ids(_limited(broker, 1, 1, release=(held.token,), claimer="a")) == []
        message = signals.get_message(timeout=5)
        assert message is not None and message["type"] == "message"  # b: come and take it
        (b_lease,) = _limited(broker, 1, 1, claimer="b").leases
        # a is owed now, but no task is left due: the slot b gives back wakes nobody.
        assert _ids(_limited(broker, 1, 1, release=(b_lease.token,), claimer="b")) == []
        assert signals.get_message(timeout=0.2) is None
    finally:
        signals.close()


def test_a_waiter_that_never_comes_back_is_owed_a_slot_for_one_lease_ttl_only(open_broker: Factory) -> None:
    clock = ManualClock()
    broker = open_broker(clock=clock)
    _pending(broker, 3)
    (held,) = _limited(broker, 1, 1, claimer="a").leases
    assert _ids(_limited(broker, 1, 1, claimer="gone")) == []
    assert _ids(_limited(broker, 1, 1, release=(held.token,), claimer="a")) == []
    clock.advance(TTL)
    assert _ids(_limited(broker, 1, 1, claimer="a")) == ["t1"]


# -- settle: any mix of items, and capacity given back, in one script --------------------------


def _script_runs(broker: RedisBroker, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The names of the scripts ``broker`` runs from now on, one per FCALL, in order."""
    book = broker._scripts
    ran: list[str] = []
    run = book.run

    def counted(name: str, *args: Any) -> Any:
        ran.append(name)
        return run(name, *args)

    monkeypatch.setattr(book, "run", counted)
    return ran


@pytest.mark.parametrize(
    ("end", "status"),
    [
        (lambda lease: Complete(lease.task.id, lease.token, b"r"), Status.COMPLETED),
        (lambda lease: Retry(lease.task.id, lease.token, FailureKind.BUSINESS, "x", TTL), Status.RETRYING),
        (lambda lease: Fail(lease.task.id, lease.token, FailureKind.SKIP, "x"), Status.FAILED),
        (lambda lease: Requeue(lease.task.id, lease.token), Status.PENDING),
        (lambda lease: Canceled(lease.task.id, lease.token), Status.CANCELED),
    ],
)
def test_a_settle_of_one_item_is_one_script(
    open_broker: Factory, monkeypatch: pytest.MonkeyPatch, end: Callable[[Lease], Finish], status: Status
) -> None:
    broker = open_broker(clock=ManualClock())
    _pending(broker, 2)
    loud, quiet = steps.claim(broker, "q", 2, TTL)
    ran = _script_runs(broker, monkeypatch)
    (answer,) = broker.settle(Settle((end(loud),)))
    assert isinstance(answer, Task) and answer.status is status and answer == broker.get(loud.task.id)
    assert broker.settle(Settle((end(quiet),), snapshots=False)) == [None]
    assert broker.get(quiet.task.id).status is status
    assert len(ran) == 2


def test_a_mixed_settle_is_one_script_answering_each_item_in_order(
    open_broker: Factory, client: redis.Redis, unique_prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = ManualClock()
    broker = open_broker(clock=clock)
    _pending(broker, 5)
    quota = QuotaSpec("api", 10, timedelta(minutes=1))
    taken = _limited(broker, 5, 5, quota=quota)
    done, retried, failed, requeued, canceled = taken.leases
    assert taken.quota is not None
    items: tuple[Finish, ...] = (
        Complete(done.task.id, done.token, b"r"),
        Retry(retried.task.id, retried.token, FailureKind.THROTTLED, "busy", timedelta(seconds=5)),
        Fail(failed.task.id, "stale", FailureKind.BUSINESS, "no"),
        Requeue(requeued.task.id, requeued.token),
        Canceled("missing", canceled.token),
        Fail(failed.task.id, failed.token, FailureKind.BUSINESS, "no"),
        Complete(done.task.id, done.token, b"again"),  # settled above: lost
    )
    give_back = GiveBack(quota=((taken.quota, 1),), queue="q", slots=(requeued.token, retried.token))
    ran = _script_runs(broker, monkeypatch)
    answers = broker.settle(Settle(items, give_back=give_back))
    assert ran == ["settle"]
    assert [getattr(a, "status", type(a)) for a in answers] == [
        Status.COMPLETED,
        Status.RETRYING,
        LeaseLostError,
        Status.PENDING,
        TaskNotFoundError,
        Status.FAILED,
        LeaseLostError,
    ]
    assert answers[0] == broker.get(done.task.id) and broker.get(done.task.id).result == b"r"
    retried_now = broker.get(retried.task.id)
    assert (retried_now.throttled, retried_now.attempts, retried_now.last_error) == (1, 0, "busy")
    assert retried_now.run_at == clock.now() + timedelta(seconds=5)
    assert broker.get(canceled.task.id).status is Status.RUNNING  # its item named no such task
    # Given back after the items: the slots named, and one quota unit.
    assert _slots_held(client, unique_prefix) == {done.token, failed.token, canceled.token}
    used = client.hget(KeySpace(unique_prefix).base + "quota:api", "used")
    assert used == b"4"


def test_a_quiet_settle_answers_none_for_each_item_that_took_effect(open_broker: Factory) -> None:
    broker = open_broker(clock=ManualClock())
    _pending(broker, 2)
    first, second = steps.claim(broker, "q", 2, TTL)
    answers = broker.settle(
        Settle(
            (Retry(first.task.id, first.token, FailureKind.BUSINESS, "x"), Complete(second.task.id, "stale")),
            snapshots=False,
        )
    )
    assert answers[0] is None and isinstance(answers[1], LeaseLostError)
    assert broker.get(first.task.id).status is Status.RETRYING


def test_a_settle_with_nothing_to_write_sends_nothing(
    open_broker: Factory, monkeypatch: pytest.MonkeyPatch
) -> None:
    broker = open_broker(clock=ManualClock())
    _pending(broker, 1)
    taken = broker.claim(Claim("q", 1, TTL, quota=QuotaSpec("api", 1, timedelta(minutes=1))))
    assert taken.quota is not None
    ran = _script_runs(broker, monkeypatch)
    assert broker.settle(Settle()) == []
    assert broker.settle(Settle(give_back=GiveBack(quota=((taken.quota, 0),), queue="q"))) == []
    assert ran == []
    assert broker.split(broker.settle, Settle()) is None


def test_a_give_back_that_raises_leaves_the_items_unwritten(
    open_broker: Factory, client: redis.Redis, unique_prefix: str
) -> None:
    broker = open_broker(clock=ManualClock())
    _pending(broker, 2)
    first, second = steps.claim(broker, "q", 2, TTL)
    client.set(KeySpace(unique_prefix).slots("q"), "not a sorted set")
    with pytest.raises(BrokerError, match="WRONGTYPE"):
        broker.settle(
            Settle(
                (Complete(first.task.id, first.token), Requeue(second.task.id, second.token)),
                give_back=GiveBack(queue="q", slots=(first.token,)),
            )
        )
    # The capacity goes back before the items are written: the script raised before any was.
    assert [broker.get(lease.task.id) for lease in (first, second)] == [first.task, second.task]
    assert broker.counts() == {"t": {Status.RUNNING: 2}}


# -- wake-ups ----------------------------------------------------------------------------------


def test_close_wakes_every_waiter_with_false(
    open_broker: Factory, client: redis.Redis, unique_prefix: str
) -> None:
    broker = open_broker()
    outcomes: list[object] = []

    def wait() -> None:
        try:
            outcomes.append(broker.wait_for_work(["q"], 30.0))
        except Exception as exc:
            outcomes.append(exc)

    waiters = [threading.Thread(target=wait, daemon=True) for _ in range(3)]
    for waiter in waiters:
        waiter.start()
    channel = KeySpace(unique_prefix).signal("q")
    deadline = time.monotonic() + 10
    while client.pubsub_numsub(channel)[0][1] < len(waiters):  # every waiter is in its read
        assert time.monotonic() < deadline, "the waiters never subscribed"
        time.sleep(0.01)
    closed_at = time.monotonic()
    broker.close()
    for waiter in waiters:
        waiter.join(5)
    assert outcomes == [False, False, False]
    assert time.monotonic() - closed_at < SLICE + 1.0


# -- running tasks: listed from the leases set, not from a status set of their own ---------------


def test_running_tasks_get_no_status_set_and_the_reaper_trims_the_one_earlier_builds_kept(
    open_broker: Factory, client: redis.Redis, unique_prefix: str
) -> None:
    clock = ManualClock()
    broker = open_broker(clock=clock)
    _pending(broker, 5)
    leases = steps.claim(broker, "q", 4, TTL)
    legacy = KeySpace(unique_prefix).base + "idx:status:running"
    assert client.exists(legacy) == 0
    # A process of an earlier build, during a rolling redeploy, adds what it claims there.
    client.zadd(legacy, {lease.task.id: n for n, lease in enumerate(leases)})
    first, second, third, fourth = leases
    steps.ack(broker, first.task.id, first.token, None)
    assert broker.settle(Settle((Complete(second.task.id, second.token),), snapshots=False)) == [None]
    steps.retry(broker, third.task.id, third.token, kind=FailureKind.BUSINESS, error="x", delay=TTL)
    assert broker.reap(lease_lost_max=5) == []
    assert client.zrange(legacy, 0, -1, withscores=True) == [(fourth.task.id.encode(), 3.0)]
    assert [t.id for t in broker.list(Filter(status=Status.RUNNING))] == [fourth.task.id]
    clock.advance(TTL.total_seconds())
    assert [t.id for t in broker.reap(lease_lost_max=5)] == [fourth.task.id]
    assert client.exists(legacy) == 0


def test_a_running_task_whose_hash_is_gone_does_not_stop_the_reaper(
    open_broker: Factory, client: redis.Redis, unique_prefix: str
) -> None:
    # An operator's DEL (or an eviction) of a running task's hash leaves its id in the leases
    # set: the reaper drops that id and goes on reaping the others, pass after pass.
    clock = ManualClock()
    broker = open_broker(clock=clock)
    keys = KeySpace(unique_prefix)
    _pending(broker, 3)
    orphan, kept, later = steps.claim(broker, "q", 3, TTL)
    client.delete(keys.task(orphan.task.id))
    clock.advance(TTL.total_seconds())
    steps.heartbeat(broker, later.task.id, later.token, TTL)  # expires one TTL after the others
    reaped = broker.reap(lease_lost_max=5)
    assert [(t.id, t.status, t.lease_lost) for t in reaped] == [(kept.task.id, Status.PENDING, 1)]
    assert client.zscore(keys.base + "leases", orphan.task.id) is None
    assert client.exists(keys.task(orphan.task.id)) == 0  # no stub hash left behind
    clock.advance(TTL.total_seconds())
    assert [t.id for t in broker.reap(lease_lost_max=5)] == [later.task.id]  # and the next pass
    assert broker.reap(lease_lost_max=5) == []


# -- acks and the next claim in one script (a claim carrying acks) -----------------------------


@pytest.mark.parametrize("carries", ["nothing", "quota", "shared"])
def test_a_claim_carrying_acks_is_one_chained_script(
    open_broker: Factory, monkeypatch: pytest.MonkeyPatch, carries: str
) -> None:
    broker = open_broker(clock=ManualClock())
    _pending(broker, 4)
    first = steps.claim(broker, "q", 2, TTL)
    acks = tuple(Complete(lease.task.id, lease.token, b"r") for lease in first)
    quota = QuotaSpec("api", 10, timedelta(minutes=1)) if carries == "quota" else None
    shared = SharedLimits(workers=5) if carries == "shared" else None
    ran = _script_runs(broker, monkeypatch)
    claimed = broker.claim(Claim("q", 2, TTL, quota=quota, shared=shared, acks=acks))
    chain = {"nothing": "ack_claim", "quota": "ack_claim_quota", "shared": "ack_claim_limited"}[carries]
    assert ran == [chain]
    assert claimed.acked == [None, None] and _ids(claimed) == ["t2", "t3"] and claimed.failed is None
    assert (claimed.quota is not None) is (carries == "quota")
    assert [broker.get(task_id).result for task_id in ("t0", "t1")] == [b"r", b"r"]
    assert broker.counts() == {"t": {Status.COMPLETED: 2, Status.RUNNING: 2}}


def test_acks_chained_with_a_limited_claim_give_slots_back_and_claim_in_one_script(
    open_broker: Factory, client: redis.Redis, unique_prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    broker = open_broker(clock=ManualClock())
    _pending(broker, 4)
    first = _limited(broker, 2, 2)
    acks = tuple(Complete(lease.task.id, lease.token, b"r") for lease in first.leases)
    released = tuple(lease.token for lease in first.leases)
    ran = _script_runs(broker, monkeypatch)
    claimed = _limited(broker, 2, 2, acks=acks, release=released)
    assert ran == ["ack_claim_limited"]
    assert claimed.acked == [None, None] and _ids(claimed) == ["t2", "t3"]
    assert [broker.get(task_id).result for task_id in ("t0", "t1")] == [b"r", b"r"]
    assert _slots_held(client, unique_prefix) == {lease.token for lease in claimed.leases}
    assert broker.counts() == {"t": {Status.COMPLETED: 2, Status.RUNNING: 2}}


def test_a_limited_claim_after_acks_leases_the_child_they_made_ready(open_broker: Factory) -> None:
    broker = open_broker(clock=ManualClock())
    steps.enqueue(broker, [NewTask(id="parent", type="t", queue="parents")])
    (parent,) = steps.claim(broker, "parents", 1, TTL)
    steps.enqueue(broker, [NewTask(id="child", type="t", queue="q", depends_on=("parent",))])
    claimed = _limited(broker, 5, 5, acks=(Complete("parent", parent.token),))
    assert claimed.acked == [None] and _ids(claimed) == ["child"]


def test_a_limited_claim_after_acks_answers_a_stale_ack_alone(open_broker: Factory) -> None:
    broker = open_broker(clock=ManualClock())
    _pending(broker, 2)
    (lease,) = steps.claim(broker, "q", 1, TTL)
    claimed = _limited(broker, 5, 5, acks=(Complete(lease.task.id, "stale"),))
    assert isinstance(claimed.acked[0], LeaseLostError) and _ids(claimed) == ["t1"]
    assert broker.get(lease.task.id).status is Status.RUNNING


def test_a_claim_that_fails_after_the_chained_acks_leaves_them_written(
    open_broker: Factory, client: redis.Redis, unique_prefix: str
) -> None:
    broker = open_broker(clock=ManualClock())
    _pending(broker, 2)
    (lease,) = steps.claim(broker, "q", 1, TTL)
    slots = KeySpace(unique_prefix).slots("q")
    client.set(slots, "not a sorted set")  # the claim part's first slot command fails
    claimed = _limited(broker, 2, 1, acks=(Complete(lease.task.id, lease.token, b"r"),))

    assert claimed.acked == [None] and claimed.leases == []
    assert isinstance(claimed.failed, BrokerError)
    assert "ack_claim_limited failed in its claim part" in str(claimed.failed)
    assert "WRONGTYPE" in str(claimed.failed)
    assert broker.get(lease.task.id).result == b"r"
    assert broker.counts() == {"t": {Status.COMPLETED: 1, Status.PENDING: 1}}
    client.delete(slots)
    assert _ids(_limited(broker, 2, 1)) == ["t1"]


# -- submit and the business-key listing ----------------------------------------------------------


def test_a_submit_without_snapshots_answers_the_statuses_alone(open_broker: Factory) -> None:
    broker = open_broker(clock=ManualClock())
    tasks = (NewTask(id="p", type="t", queue="q"), NewTask(id="c", type="t", queue="q", depends_on=("p",)))
    assert broker.submit(Submit(tasks, snapshots=False)) == Submitted(
        statuses=[Status.PENDING, Status.BLOCKED]
    )
    assert broker.submit(Submit(())) == Submitted(statuses=[])
    loud = broker.submit(Submit((NewTask(id="x", type="t", queue="q"),)))
    assert loud.statuses == [Status.PENDING] and loud.tasks == [broker.get("x")]


def test_a_business_key_lists_its_executions_in_the_order_they_were_made(open_broker: Factory) -> None:
    # A frozen clock: every execution has the same created_at, and the replays' ids sort
    # before the first's. Only the key's own list knows the order; it is read, not the tasks.
    broker = open_broker(clock=ManualClock())
    steps.enqueue(broker, [NewTask(id="z", type="t", queue="q", business_key="k")])
    for old, new in (("z", "m"), ("m", "a")):
        (lease,) = steps.claim(broker, "q", 1, TTL)
        steps.fail(broker, old, lease.token, kind=FailureKind.BUSINESS, error="no")
        steps.replay(broker, old, new_id=new)
    assert [t.id for t in broker.list(Filter(business_key="k"))] == ["z", "m", "a"]
    assert [t.id for t in broker.list(Filter(business_key="k", offset=1, limit=1))] == ["m"]
    assert [t.id for t in broker.list(Filter(business_key="k", status=Status.FAILED))] == ["z", "m"]
    assert [t.id for t in broker.list(Filter(business_key="k", status=Status.FAILED, offset=1))] == ["m"]
    assert broker.list(Filter(business_key="k", queue="other")) == []
    assert broker.list(Filter(business_key="unknown")) == []
    with pytest.raises(ValueError, match="business_key"):
        broker.list(Filter(business_key="k" * 256))


# -- snapshots: scripts answer a task as its SNAPSHOT_FIELDS values, read once per task --------


def _child_claimed_again(open_broker: Factory) -> tuple[RedisBroker, ManualClock, Lease]:
    """A child with every optional field set, run once and retried, then claimed again."""
    clock = ManualClock()
    broker = open_broker(clock=clock)
    steps.enqueue(broker, [NewTask(id="parent", type="t", queue="q")])
    (parent_lease,) = steps.claim(broker, "q", 1, TTL)
    steps.ack(broker, "parent", parent_lease.token, None)
    child = NewTask(
        id="child",
        type="t",
        queue="q",
        payload=b"\x00in",
        business_key="bk",
        depends_on=("parent",),
        max_retry=3,
    )
    steps.enqueue(broker, [child])
    (lease,) = steps.claim(broker, "q", 1, TTL)
    steps.retry(
        broker, "child", lease.token, kind=FailureKind.BUSINESS, error="boom", delay=timedelta(seconds=1)
    )
    clock.advance(2)
    (lease,) = steps.claim(broker, "q", 1, TTL)
    return broker, clock, lease


def test_every_field_a_task_hash_holds_is_in_the_snapshot(
    open_broker: Factory, client: redis.Redis, unique_prefix: str
) -> None:
    broker, _, lease = _child_claimed_again(open_broker)
    task_id = lease.task.id
    broker.cancel(task_id)  # running: marked, still held
    stored = {name.decode() for name in _stored(client, unique_prefix, task_id)}
    assert stored <= set(SNAPSHOT_FIELDS)
    steps.ack(broker, task_id, lease.token, b"out")
    stored |= {name.decode() for name in _stored(client, unique_prefix, task_id)}
    assert stored <= set(SNAPSHOT_FIELDS)
    assert {"payload", "result", "last_error", "business_key", "started_at", "finished_at"} <= stored


def test_a_claim_answers_the_task_as_stored_after_it(
    open_broker: Factory, client: redis.Redis, unique_prefix: str
) -> None:
    # The lease fields come last: a claim reads the snapshot up to them and sets them itself.
    assert SNAPSHOT_FIELDS[-2:] == ("token", "lease_until")
    broker, clock, lease = _child_claimed_again(open_broker)
    assert lease.task == broker.get(lease.task.id)
    assert (lease.task.claims, lease.task.attempts, lease.task.last_error) == (2, 1, "boom")
    assert lease.task.started_at == clock.now()
    stored = _stored(client, unique_prefix, lease.task.id)
    assert stored[b"token"].decode() == lease.token
    assert from_us(stored[b"lease_until"]) == lease.expires_at == clock.now() + TTL


@pytest.mark.parametrize("result", [None, b"", b"out"])
def test_an_ack_answers_the_task_as_stored_after_it(open_broker: Factory, result: bytes | None) -> None:
    broker, clock, lease = _child_claimed_again(open_broker)
    broker.cancel(lease.task.id)
    clock.advance(1)
    (done,) = steps.ack_many(broker, [(lease.task.id, lease.token, result)])
    assert done == broker.get(lease.task.id)
    assert isinstance(done, Task) and done.status is Status.COMPLETED and done.result == result
    assert done.finished_at == clock.now()


def test_a_batch_acking_one_task_twice_answers_the_second_item_as_lost(open_broker: Factory) -> None:
    broker = open_broker()
    steps.enqueue(broker, [NewTask(id="a", type="t", queue="q")])
    (lease,) = steps.claim(broker, "q", 1, TTL)
    first, second = steps.ack_many(broker, [("a", lease.token, b"1"), ("a", lease.token, b"2")])
    assert first == broker.get("a") and isinstance(first, Task) and first.result == b"1"
    assert isinstance(second, LeaseLostError) and "completed" in str(second)


def test_get_of_an_unknown_task_is_not_found(open_broker: Factory) -> None:
    with pytest.raises(TaskNotFoundError, match="'nope'"):
        open_broker().get("nope")
