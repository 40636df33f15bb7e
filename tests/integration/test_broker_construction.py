"""Constructing a broker never connects: an application importing a module-level gate starts
while its store is down, and the first call says what is wrong. A missing driver names the
extra that installs it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from taskgate import Config, Gate, QueueConfig
from taskgate.brokers import open_broker
from taskgate.brokers.sql import SchemaError, SQLBroker
from taskgate.errors import BrokerError

# Nothing listens on port 1; the directory does not exist.
UNREACHABLE = {
    "postgresql": "postgresql://postgres@127.0.0.1:1/nothing",
    "mysql": "mysql://root@127.0.0.1:1/nothing",
    "mariadb": "mariadb://root@127.0.0.1:1/nothing",
    "sqlite": "sqlite:////nonexistent-taskgate-dir/tasks.db",
    "redis": "redis://127.0.0.1:1/0",
}


@pytest.mark.parametrize("url", UNREACHABLE.values(), ids=UNREACHABLE.keys())
def test_a_broker_on_an_unreachable_store_is_built_and_its_first_call_raises_broker_error(url: str) -> None:
    broker = open_broker(url)
    try:
        with pytest.raises(BrokerError) as caught:
            broker.get("a")
        assert caught.value.__cause__ is not None  # the driver's error, chained
        with pytest.raises(BrokerError):  # and again: nothing was cached from the failure
            broker.counts()
    finally:
        broker.close()


def test_a_memory_broker_is_built_and_used_as_ever() -> None:
    broker = open_broker("memory://")
    assert broker.counts() == {}
    broker.close()


def test_constructing_a_sqlite_broker_touches_no_file_until_its_first_call(tmp_path: Path) -> None:
    path = tmp_path / "tasks.db"
    broker = SQLBroker(f"sqlite:///{path}")
    assert not path.exists()

    assert broker.counts() == {}

    assert path.exists()
    broker.close()


def test_a_missing_schema_is_reported_by_the_first_call_and_again_until_migrated(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'tasks.db'}"
    broker = SQLBroker(url, create_tables=False)
    try:
        for _ in range(2):
            with pytest.raises(SchemaError, match="at nothing, need"):
                broker.counts()
        from taskgate.migrate import upgrade

        upgrade(url)
        assert broker.counts() == {}
    finally:
        broker.close()


@pytest.mark.anyio
async def test_a_gate_over_an_unreachable_store_is_built_and_its_first_submit_raises_broker_error() -> None:
    broker = open_broker(UNREACHABLE["postgresql"])
    gate = Gate(Config(broker=broker, queues={"q": QueueConfig(workers=1)}, routes={"t": "q"}))

    with pytest.raises(BrokerError):
        await gate.submit("t")
    broker.close()


def run_without(module: str, code: str) -> subprocess.CompletedProcess[str]:
    """Run ``code`` in a fresh interpreter where importing ``module`` fails, as if not installed."""
    script = f"import sys\nsys.modules[{module!r}] = None\n{code}"
    return subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)


EXPECT_CONFIG_ERROR = """
from taskgate.errors import ConfigError
try:
    {call}
except ConfigError as exc:
    print(exc)
else:
    raise SystemExit("no ConfigError")
"""


@pytest.mark.parametrize(
    ("module", "call", "extra"),
    [
        ("psycopg", "SQLBroker('postgresql://u@h/db')", "postgresql"),
        ("psycopg", "open_broker('postgresql+psycopg://u@h/db')", "postgresql"),
        ("pymysql", "SQLBroker('mysql://u@h/db')", "mysql"),
        ("pymysql", "open_broker('mariadb://u@h/db')", "mysql"),
        ("redis", "open_broker('redis://h:6379/0')", "redis"),
        ("redis", "from taskgate.brokers import RedisBroker", "redis"),
    ],
)
def test_a_missing_driver_raises_config_error_naming_the_extra(module: str, call: str, extra: str) -> None:
    code = "from taskgate.brokers import open_broker\nfrom taskgate.brokers.sql import SQLBroker\n"
    done = run_without(module, code + EXPECT_CONFIG_ERROR.format(call=call))

    assert done.returncode == 0, done.stderr + done.stdout
    assert f"needs the {module} driver" in done.stdout
    assert f"pip install 'taskgate[{extra}]'" in done.stdout


def test_import_taskgate_needs_no_driver() -> None:
    code = (
        "for name in ('psycopg', 'pymysql', 'redis', 'hiredis'):\n"
        "    sys.modules[name] = None\n"
        "import taskgate, taskgate.brokers, taskgate.models\n"
        "from taskgate.brokers import MemoryBroker, SQLBroker\n"
        "SQLBroker('sqlite://').close()\n"
        "MemoryBroker().close()\n"
    )
    done = run_without("psycopg", code)
    assert done.returncode == 0, done.stderr
