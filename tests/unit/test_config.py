from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from taskgate import Config, ConfigError, Gate, QueueConfig, Schedule
from taskgate.brokers.base import Capabilities
from taskgate.brokers.memory import MemoryBroker

BROKER = MemoryBroker()


def test_queue_config_defaults_match_the_spec() -> None:
    q = QueueConfig(workers=2)
    assert q.lease == timedelta(seconds=60)
    assert (q.rps, q.burst, q.quota_limit, q.quota_period, q.manual_heartbeat) == (0, 0, 0, None, False)
    assert q.timeout is q.run_limit is None
    assert q.effective_burst == 1
    assert QueueConfig(workers=1, rps=3.5).effective_burst == 3
    assert QueueConfig(workers=1, rps=3, burst=7).effective_burst == 7


def test_back_pressure_is_off_by_default_and_blocks_when_set() -> None:
    assert (QueueConfig(workers=1).max_pending, QueueConfig(workers=1).on_full) == (0, "block")
    assert QueueConfig(workers=1, max_pending=5, on_full="raise").on_full == "raise"
    built = QueueConfig.from_mapping({"workers": 1, "max_pending": 3, "on_full": "raise"})
    assert (built.max_pending, built.on_full) == (3, "raise")


def test_durations_accept_strings_seconds_and_timedeltas() -> None:
    q = QueueConfig(workers=1, lease_ttl="1h30m", quota_limit=10, quota_period="24h")
    assert q.lease == timedelta(hours=1, minutes=30)
    assert q.period == timedelta(hours=24)
    assert QueueConfig(workers=1, lease_ttl=5).lease == timedelta(seconds=5)
    assert QueueConfig(workers=1, timeout="1m30s").run_limit == timedelta(seconds=90)
    assert QueueConfig(workers=1, timeout=0.25).run_limit == timedelta(milliseconds=250)
    assert QueueConfig(workers=1, timeout=timedelta(hours=2)).timeout == timedelta(hours=2)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"workers": 0}, r"QueueConfig\.workers must be >= 1, got 0"),
        ({"workers": 2.5}, r"QueueConfig\.workers must be an integer, got 2\.5"),
        ({"workers": 1, "rps": -1}, r"QueueConfig\.rps must be >= 0, got -1"),
        ({"workers": 1, "rps": float("inf")}, r"QueueConfig\.rps must be a finite number"),
        ({"workers": 1, "burst": -2}, r"QueueConfig\.burst must be >= 0, got -2"),
        ({"workers": 1, "lease_ttl": -5}, r"QueueConfig\.lease_ttl must be > 0, got -5"),
        ({"workers": 1, "lease_ttl": "soon"}, r"QueueConfig\.lease_ttl: cannot read 'soon'"),
        ({"workers": 1, "quota_limit": -1}, r"QueueConfig\.quota_limit must be >= 0, got -1"),
        ({"workers": 1, "quota_limit": 5}, r"quota_limit=5 needs a quota_period"),
        ({"workers": 1, "quota_limit": 5, "quota_period": "500ms"}, r"quota_period must be >= 1s"),
        ({"workers": 1, "manual_heartbeat": "yes"}, r"manual_heartbeat must be a bool"),
        ({"workers": 1, "timeout": 0}, r"QueueConfig\.timeout must be > 0 and at most 36500 days, got 0"),
        ({"workers": 1, "timeout": -0.5}, r"QueueConfig\.timeout must be > 0 .*, got -0\.5"),
        ({"workers": 1, "timeout": timedelta(0)}, r"QueueConfig\.timeout must be > 0"),
        ({"workers": 1, "timeout": "40000d"}, r"QueueConfig\.timeout must be > 0 .*, got '40000d'"),
        ({"workers": 1, "timeout": float("nan")}, r"QueueConfig\.timeout: duration must be finite, got nan"),
        ({"workers": 1, "timeout": float("inf")}, r"QueueConfig\.timeout: duration must be finite, got inf"),
        ({"workers": 1, "timeout": "soon"}, r"QueueConfig\.timeout: cannot read 'soon'"),
        ({"workers": 1, "timeout": True}, r"QueueConfig\.timeout: expected a duration, got True"),
        ({"workers": 1, "timeout": [30]}, r"QueueConfig\.timeout: expected a duration"),
        ({"workers": 1, "group_workers": -1}, r"QueueConfig\.group_workers must be >= 0, got -1"),
        ({"workers": 1, "group_rps": float("nan")}, r"QueueConfig\.group_rps must be a finite number"),
        ({"workers": 1, "group_rps": -2}, r"QueueConfig\.group_rps must be >= 0, got -2"),
        ({"workers": 1, "group_burst": 1.5}, r"QueueConfig\.group_burst must be an integer"),
        ({"workers": 1, "group_quota_limit": 3}, r"group_quota_limit=3 needs a quota_period"),
        ({"workers": 1, "group_workers": 1, "shared_limits": False}, r"group limits .* shared_limits=True"),
        ({"workers": 1, "max_pending": -1}, r"QueueConfig\.max_pending must be >= 0, got -1"),
        ({"workers": 1, "max_pending": 2.5}, r"QueueConfig\.max_pending must be an integer, got 2\.5"),
        ({"workers": 1, "max_pending": True}, r"QueueConfig\.max_pending must be an integer, got True"),
        ({"workers": 1, "max_pending": "10"}, r"QueueConfig\.max_pending must be an integer, got '10'"),
        ({"workers": 1, "on_full": "drop"}, r"QueueConfig\.on_full must be 'block' or 'raise', got 'drop'"),
        ({"workers": 1, "on_full": None}, r"QueueConfig\.on_full must be 'block' or 'raise', got None"),
        ({"workers": 1, "on_full": ["raise"]}, r"QueueConfig\.on_full must be 'block' or 'raise'"),
    ],
)
def test_bad_queue_config_names_field_and_value(kwargs: dict[str, Any], match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        QueueConfig(**kwargs)


def test_route_to_an_unconfigured_queue_needs_a_default_queue() -> None:
    with pytest.raises(ConfigError, match=r"routes\['generate'\] = 'llm': no such queue"):
        Config(broker=BROKER, queues={"cpu": QueueConfig(workers=1)}, routes={"generate": "llm"})
    conf = Config(broker=BROKER, routes={"generate": "llm"}, default_queue=QueueConfig(workers=2))
    assert conf.queue_for("generate") == "llm"
    assert conf.queue_config("llm") == QueueConfig(workers=2)


def test_types_without_a_route_go_to_the_queue_of_their_own_name() -> None:
    conf = Config(broker=BROKER, queues={"ocr": QueueConfig(workers=1)})
    assert conf.queue_for("ocr") == "ocr"
    assert conf.queue_config("ocr") == QueueConfig(workers=1)
    assert conf.queue_config("other") is None


def test_queues_sharing_a_quota_key_must_share_the_limit() -> None:
    a = QueueConfig(workers=1, quota_limit=10, quota_period="1h", quota_key="gw")
    b = QueueConfig(workers=1, quota_limit=20, quota_period="1h", quota_key="gw")
    with pytest.raises(ConfigError, match="share quota_key 'gw' with different limits"):
        Config(broker=BROKER, queues={"a": a, "b": b})
    conf = Config(broker=BROKER, queues={"a": a, "c": a})
    assert conf.quota_key("a") == conf.quota_key("c") == "gw"


def test_config_counters_are_validated() -> None:
    with pytest.raises(ConfigError, match=r"Config\.lease_lost_max must be >= 1, got 0"):
        Config(broker=BROKER, lease_lost_max=0)
    with pytest.raises(ConfigError, match=r"Config\.max_retry must be >= 0, got -1"):
        Config(broker=BROKER, max_retry=-1)
    with pytest.raises(ConfigError, match="broker is required"):
        Config(broker=None)  # type: ignore[arg-type]


def test_from_mapping_reads_the_seed_yaml_shape() -> None:
    data = {
        "queues": {
            "llm": {
                "workers": 2,
                "rps": 3,
                "burst": 3,
                "lease_ttl": "60s",
                "quota_limit": 5000,
                "quota_period": "24h",
                "quota_key": "my-gw",
            },
            "cpu": {"workers": 4, "timeout": "90s"},
        },
        "routes": {"generate": "llm"},
        "default_queue": {"workers": 2},
        "lease_lost_max": 3,
        "throttled_max": 100,
    }
    conf = Config.from_mapping(data, broker=BROKER)
    assert conf.queues["llm"].period == timedelta(hours=24)
    assert conf.queues["llm"].quota_key == "my-gw"
    assert (conf.queues["cpu"].run_limit, conf.queues["llm"].run_limit) == (timedelta(seconds=90), None)
    assert conf.default_queue == QueueConfig(workers=2)
    assert conf.queue_for("generate") == "llm"


def test_from_mapping_reads_schedules() -> None:
    data = {
        "queues": {"llm": {"workers": 1}},
        "schedules": [
            {"name": "nightly", "cron": "0 3 * * *", "type": "llm", "timezone": "Europe/Berlin"},
            {
                "name": "digest",
                "cron": "*/15 * * * *",
                "type": "llm",
                "payload": {"kind": "digest"},
                "catch_up": True,
                "max_retry": 2,
                "priority": 5,
            },
        ],
    }
    conf = Config.from_mapping(data, broker=BROKER)
    assert list(conf.schedules) == [
        Schedule("nightly", "0 3 * * *", "llm", timezone="Europe/Berlin"),
        Schedule("digest", "*/15 * * * *", "llm", {"kind": "digest"}, catch_up=True, max_retry=2, priority=5),
    ]
    assert dict(conf.schedules[1].submit_options) == {"max_retry": 2, "priority": 5}


@pytest.mark.parametrize(
    ("data", "match"),
    [
        ({"queuez": {}}, r"unknown key\(s\) queuez"),
        ({"queues": {"llm": {"workers": 1, "rsp": 3}}}, r"queues\.llm: unknown key\(s\) rsp"),
        ({"queues": {"llm": {"rps": 3}}}, r"queues\.llm: 'workers' is required"),
        ({"queues": {"llm": {"workers": 1, "timeout": "0s"}}}, r"queues\.llm: QueueConfig\.timeout must be"),
        ({"queues": {"llm": {"workers": 0}}}, r"queues\.llm: QueueConfig\.workers must be >= 1"),
        ({"queues": ["llm"]}, r"config\.queues must be a mapping"),
        ({"routes": "llm"}, r"config\.routes must be a mapping"),
        ({"default_queue": 3}, r"default_queue must be a mapping"),
        ({"schedules": {"name": "x"}}, r"config\.schedules must be a list of mappings"),
        ({"schedules": ["nightly"]}, r"schedules\[0\] must be a mapping"),
        ({"schedules": [{"name": "n", "type": "llm"}]}, r"schedules\[0\]: 'cron' required"),
        ({"schedules": [{"name": "n", "cron": "0 3 * * *", "type": "llm", 1: 2}]}, r"keys must be strings"),
        (
            {"schedules": [{"name": "n", "cron": "0 25 * * *", "type": "llm"}]},
            r"schedules\[0\]: schedule 'n': .*0 25",
        ),
        (
            {"schedules": [{"name": "n", "cron": "0 3 * * *", "type": "llm", "timezone": "Mars/Base"}]},
            r"schedules\[0\]: schedule 'n': unknown time zone 'Mars/Base'",
        ),
        (
            {"schedules": [{"name": "n", "cron": "0 3 * * *", "type": "llm", "business_key": "k"}]},
            r"schedules\[0\]: schedule 'n': business_key cannot be given",
        ),
    ],
)
def test_from_mapping_errors_say_where(data: dict[str, Any], match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        Config.from_mapping(data, broker=BROKER)


_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(10**6), max_value=10**6),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=12),
)
_values = st.recursive(
    _scalars,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=6,
)
_queue_keys = st.sampled_from(
    [
        "workers",
        "rps",
        "burst",
        "lease_ttl",
        "manual_heartbeat",
        "quota_limit",
        "quota_period",
        "quota_key",
        "bogus",
    ]
)
_queue_bodies = st.one_of(_values, st.dictionaries(_queue_keys, _values, max_size=6))
_top_keys = st.sampled_from(
    [
        "queues",
        "routes",
        "default_queue",
        "max_retry",
        "lease_lost_max",
        "throttled_max",
        "schedules",
        "other",
    ]
)
_schedule_keys = st.sampled_from(
    [
        "name",
        "cron",
        "type",
        "payload",
        "timezone",
        "catch_up",
        "max_retry",
        "priority",
        "business_key",
        "bogus",
    ]
)
_schedule_values = st.one_of(
    _values, st.sampled_from(["n", "0 3 * * *", "*/5 * * * * *", "llm", "Europe/Berlin", "61 * * * *"])
)
_schedules = st.lists(
    st.one_of(_values, st.dictionaries(_schedule_keys, _schedule_values, max_size=7)), max_size=3
)
_configs = st.dictionaries(
    _top_keys,
    st.one_of(_values, _schedules, st.dictionaries(st.text(max_size=6), _queue_bodies, max_size=3)),
    max_size=5,
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_configs)
def test_from_mapping_either_builds_or_raises_config_error(data: dict[str, Any]) -> None:
    """Whatever an app's YAML holds, the answer is a Config or a ConfigError -- never a crash."""
    try:
        conf = Config.from_mapping(data, broker=BROKER)
    except ConfigError as exc:
        assert str(exc)
    else:
        for queue in conf.queues.values():
            assert queue.workers >= 1 and queue.rps >= 0 and queue.lease > timedelta(0)


class _UngroupedBroker(MemoryBroker):
    """A broker that shares limits but cannot count groups."""

    capabilities = Capabilities(shared_quota=True, shared_limits=True, nonblocking=True)


def test_group_limits_on_a_broker_that_cannot_count_groups_are_refused() -> None:
    config = Config(broker=_UngroupedBroker(), queues={"q": QueueConfig(workers=2, group_workers=1)})
    with pytest.raises(
        ConfigError, match=r"queue 'q' sets group limits: broker _UngroupedBroker .*group_limits"
    ):
        Gate(config)


async def _passes(task: Any, call_next: Any) -> Any:
    return await call_next()


class _Instrument:
    async def __call__(self, task: Any, call_next: Any) -> Any:
        return await call_next()


def test_middleware_is_kept_as_a_tuple_of_coroutine_functions_or_async_callables() -> None:
    instrument = _Instrument()
    config = Config(broker=MemoryBroker(), middleware=[_passes, instrument])
    assert config.middleware == (_passes, instrument)


@pytest.mark.parametrize(
    ("middleware", "match"),
    [
        (
            [lambda task, call_next: call_next()],
            r"Config.middleware\[0\] = .*lambda.* is not a coroutine function",
        ),
        ([_passes, "log"], r"Config.middleware\[1\] = str \('log'\) is not a coroutine function"),
        (_passes, r"Config.middleware must be a list of coroutine functions"),
        ("mw", r"Config.middleware must be a list of coroutine functions"),
    ],
)
def test_middleware_that_is_not_a_coroutine_function_is_named(middleware: Any, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        Config(broker=MemoryBroker(), middleware=middleware)
