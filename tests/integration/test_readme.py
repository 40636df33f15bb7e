"""Every ```python block of the README runs as written.

Each block runs in a fresh interpreter (in a temporary directory), between a prelude that gives
it what the surrounding text says it has -- a ``broker``, ``queues``, the quick start's ``gate``
-- and an epilogue checking that it did what the text says. A block is found by a line only it
has (`RUNS`); blocks run by another test file name their place with
``readme_block("<the line before it>")`` there. `test_every_block_is_run_by_a_test` fails for a
block nobody runs, so a new example cannot go untested.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

import pytest
from helpers.readme import README, readme_block

TESTS = Path(__file__).resolve().parents[1]
WAIT = 120


def python_blocks() -> list[str]:
    """The README's ```python blocks, in order."""
    return re.findall(r"^```python\n(.*?)^```", README.read_text(), flags=re.S | re.M)


@dataclass(frozen=True)
class Run:
    """How one block runs: the code before and after it (``{block}`` inside ``around`` is
    replaced by the block, indented as the placeholder is), and what its output must show."""

    around: str
    shows: str = "ok"


MEMORY = """
from taskgate import Config, Gate, QueueConfig, Task
from taskgate.brokers.memory import MemoryBroker
broker = MemoryBroker()
queues = {"llm": QueueConfig(workers=2)}
"""

# The quick start's gate, on memory, for the blocks that build on it.
QUICK_GATE = """
import anyio
from taskgate import Config, Gate, QueueConfig, Task
from taskgate.brokers.memory import MemoryBroker
gate = Gate(Config(broker=MemoryBroker(), queues={"cpu": QueueConfig(workers=2)}, routes={"retrieve": "cpu"}))
gate.handle("retrieve", lambda task: {"docs": [task.json()["q"]]})
"""

# A running gate with a failed two-stage pipeline (``failed_id``), for the blocks of awaits.
FAILED_PIPELINE = """
import anyio
from taskgate import Config, Filter, Gate, QueueConfig, SkipRetry, Status
from taskgate.brokers.memory import MemoryBroker
gate = Gate(Config(broker=MemoryBroker(), queues={"llm": QueueConfig(workers=1)}, routes={"call": "llm"}))

@gate.handler("call")
async def call(task):
    raise SkipRetry("the gateway is down")

async def main():
    async with gate:
        failed_id = await gate.submit("call")
        stage_two = await gate.submit("call", depends_on=[failed_id])
        await gate.submit("call", group="user-42", delay="1h")
        while (await gate.get(stage_two)).status is not Status.CANCELED:
            await anyio.sleep(0.01)
        {block}
    print("ok")

anyio.run(main)
"""

TEST_CLIENT = """
from starlette.testclient import TestClient
"""

RUNS: dict[str, Run] = {
    "print(await gate.wait(sid))": Run("{block}", shows="score"),
    'taskgate.step("charge"': Run("{block}", shows="charged 1 time"),
    '@app.post("/answers")': Run(
        QUICK_GATE
        + "{block}"
        + TEST_CLIENT
        + """
with TestClient(app) as client:
    answer = client.post("/answers", params={"q": "what"})
    assert answer.status_code == 200 and len(answer.json()["id"]) == 26, answer.text
print("ok")
"""
    ),
    'Retention(completed="1d"': Run(
        MEMORY
        + "{block}"
        + """
assert config.queues["llm"].retention.failed is None and config.retention.failed.days == 90
print("ok")
"""
    ),
    '"password reset", priority=10': Run("{block}", shows="['password reset', 'newsletter', 'digest']"),
    "async def accept_hook(gate, payload)": Run(
        """
import anyio
from taskgate import Config, Gate, QueueConfig
from taskgate.brokers.memory import MemoryBroker
"""
        + "{block}"
        + """
gate = Gate(Config(broker=MemoryBroker(), queues=queues))

async def main():
    hooks = [await accept_hook(gate, n) for n in range(51)]
    assert all(hooks[:50]) and hooks[50] is None, hooks[48:]
    for n in range(1000):
        assert await ask_llm(gate, n)
    assert await ask_llm(gate, "one too many") is None  # gave up after its 2 s
    assert len(await gate.list(queue="llm")) == 1000
    print("ok")

anyio.run(main)
"""
    ),
    "await gate.purge()": Run(FAILED_PIPELINE),
    "await gate.replay(failed_id, descendants=True)": Run(FAILED_PIPELINE),
    "async def only_active_tenants": Run(
        MEMORY
        + "{block}"
        + """
import anyio
from taskgate import Status
config = Config(broker=broker, queues=queues, routes={"call": "llm"}, middleware=config.middleware)
gate = Gate(config)
gate.handle("call", lambda task: "called")

async def main():
    async with gate:
        blocked, allowed = await gate.submit("call", group="user-13"), await gate.submit("call")
        assert await gate.wait_json(allowed, timeout=10) == "called"
        while (await gate.get(blocked)).status is not Status.FAILED:
            await anyio.sleep(0.01)
    print("ok")

anyio.run(main)
"""
    ),
    "prometheus_client.start_http_server(9464)": Run(
        MEMORY
        + "{block}"
        + """
import urllib.request
scraped = urllib.request.urlopen("http://127.0.0.1:9464/metrics", timeout=10).read().decode()
assert "taskgate_submitted_total" in scraped, scraped[:2000]
print("ok")
"""
    ),
    "trace.set_tracer_provider(provider)": Run(
        "{block}"
        + QUICK_GATE
        + """
async def main():
    async with gate:
        await gate.wait(await gate.submit("retrieve", {"q": "traced"}), timeout=10)

anyio.run(main)
provider.shutdown()  # the console exporter prints the spans
""",
        shows="taskgate run retrieve",
    ),
    'app.mount("/tasks", dashboard.app(': Run(
        QUICK_GATE
        + f"{{block0}}\n{TEST_CLIENT}"
        + """
{block}
with TestClient(app) as client:
    assert client.get("/tasks/").status_code == 403
    page = client.get("/tasks/", headers={"x-ops-token": os.environ["OPS_TOKEN"]})
    assert page.status_code == 200 and ">cpu<" in page.text, page.text[:500]
print("ok")
"""
    ),
    '@gate.handler("charge", on_failure="refund")': Run("{block}", shows="refunded 0"),
    'gate.schedule("sync", "*/10 * * * * *"': Run(
        MEMORY
        + "{block}"
        + """
import anyio

async def main():
    async with gate:  # a new schedule's latest tick is submitted at once
        while len(await gate.list(type="report")) < 2:
            await anyio.sleep(0.01)
    keys = sorted(t.business_key for t in await gate.list(type="report"))
    assert keys[0].startswith("schedule:nightly-report:20") and keys[1].startswith("schedule:sync:"), keys
    print("ok")

anyio.run(main)
"""
    ),
}
# Run by tests/migrations/test_app_alembic.py, which makes these edits to a real env.py.
ALEMBIC_RECIPE = "include_object=include_object"


def _block_with(key: str) -> str:
    (found,) = [block for block in python_blocks() if key in block]
    return found


def _run_by_other_tests() -> set[str]:
    """The blocks other test files run, through ``readme_block("...")``."""
    markers = set()
    for path in TESTS.rglob("test_*.py"):
        if path != Path(__file__):
            markers |= set(re.findall(r'readme_block\(\s*"([^"]+)"', path.read_text()))
    return {readme_block(marker) for marker in markers}


def test_every_block_is_run_by_a_test() -> None:
    elsewhere = _run_by_other_tests()
    for block in python_blocks():
        keys = [key for key in RUNS if key in block]
        assert len(keys) <= 1, f"a README block matches several runs {keys}:\n{block}"
        assert keys or block in elsewhere or ALEMBIC_RECIPE in block, (
            f"no test runs this README block:\n{block}"
        )


@pytest.mark.parametrize("key", sorted(RUNS))
def test_the_block_runs_as_written(key: str, tmp_path: Path) -> None:
    run = RUNS[key]
    code = _fill(run.around, "{block}", _block_with(key))
    code = code.replace("{block0}", _block_with('@app.post("/answers")'))
    env = {**os.environ, "OPS_TOKEN": "a-token-for-the-test"}
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=WAIT, env=env
    )
    assert done.returncode == 0, f"{done.stderr}\n--- ran:\n{code}"
    assert run.shows in done.stdout, done.stdout


def _fill(around: str, placeholder: str, block: str) -> str:
    """``around`` with ``placeholder`` replaced by ``block``, indented as the placeholder is."""
    for line in around.splitlines():
        if line.strip() == placeholder:
            indent = line[: len(line) - len(line.lstrip())]
            return around.replace(line, textwrap.indent(block, indent))
    return around.replace(placeholder, block)


def test_the_alembic_recipe_is_the_one_the_migration_test_applies() -> None:
    recipe = _block_with(ALEMBIC_RECIPE)
    applied = (TESTS / "migrations" / "test_app_alembic.py").read_text()
    assert f'HOOK = "{ALEMBIC_RECIPE}"' in applied
    assert "from taskgate.models import include_object" in applied and "include_object" in recipe
