"""Bad `submit` arguments get a clear error naming the argument, and store nothing."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import anyio
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from taskgate import Config, ConfigError, Gate, QueueConfig, TaskNotFoundError
from taskgate.brokers.memory import MemoryBroker

_junk = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.floats(allow_nan=True),
    st.text(max_size=300),
    st.binary(max_size=8),
    st.lists(st.integers(), max_size=3),
    st.just(object()),
    st.just(timedelta(seconds=-5)),
    st.just(datetime(2030, 1, 1)),
    st.just(datetime(2030, 1, 1, tzinfo=UTC)),
    st.dictionaries(st.text(max_size=3), st.integers(), max_size=2),
)

# Each argument, and the words its error message must contain to count as naming it.
_ARGUMENTS = {
    "type": ("task type", "queue"),
    "payload": ("payload",),
    "business_key": ("business_key",),
    "delay": ("delay",),
    "run_at": ("run_at",),
    "max_retry": ("max_retry",),
    "depends_on": ("depends_on",),
    "ignore_parent_failure": ("ignore_parent_failure",),
}


def _submit(gate: Gate, name: str, value: Any) -> str:
    kwargs: dict[str, Any] = {name: value}
    task_type = kwargs.pop("type", "work")
    payload = kwargs.pop("payload", None)

    async def go() -> str:
        return await gate.submit(task_type, payload, **kwargs)

    return anyio.run(go)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(name=st.sampled_from(sorted(_ARGUMENTS)), value=_junk)
def test_bad_submit_arguments_are_named_and_change_nothing(name: str, value: Any) -> None:
    broker = MemoryBroker()  # process memory: dropped with the test, nothing to close
    gate = Gate(Config(broker=broker, queues={"work": QueueConfig(workers=1)}))
    try:
        task_id = _submit(gate, name, value)
    except TaskNotFoundError:
        assert name == "depends_on"  # well-formed ids of parents that do not exist
    except (TypeError, ValueError, ConfigError) as exc:
        message = str(exc)
        assert any(word in message for word in _ARGUMENTS[name]), f"{name}={value!r}: {message}"
    else:
        assert broker.get(task_id).type == ("work" if name != "type" else value)
        return
    assert not any(n for by_status in broker.counts().values() for n in by_status.values())
