"""The ``taskgate`` command line, run as a real subprocess against SQLite, PostgreSQL, MariaDB
and Redis: every subcommand's table and ``--json`` output, the worker's graceful stop, and
the one-line errors.

One store per backend for the whole module (migrated by ``taskgate migrate``, under a table or
key prefix of its own, passed as ``TASKGATE_PREFIX``), seeded once by the app's gate run in
this process; tests that change tasks use types and queues of their own.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import pytest
from helpers.sql_databases import (
    REDIS_URL,
    mysql_database,
    postgresql_database,
    require_mysql,
    require_postgresql,
    require_redis,
)

from taskgate import Config, Gate, QueueConfig, Status, TaskFailedError

from . import cli_app

APP_DIR = Path(__file__).resolve().parent
CONSOLE_SCRIPT = Path(sys.executable).with_name("taskgate")
WAIT = 30.0


@dataclass
class Store:
    """A store the CLI is pointed at, and the ids of the tasks seeded into it."""

    name: str
    url: str
    prefix: str
    ids: dict[str, str] = field(default_factory=dict)

    def run(self, *args: str, code: int = 0, use_env: bool = True) -> subprocess.CompletedProcess[str]:
        """``python -m taskgate ARGS`` with the store in the environment; asserts the exit status."""
        env = {**os.environ, "TASKGATE_URL": self.url, "TASKGATE_PREFIX": self.prefix}
        if not use_env:
            del env["TASKGATE_URL"], env["TASKGATE_PREFIX"]
        proc = cli(*args, env=env)
        assert proc.returncode == code, (proc.stdout, proc.stderr)
        return proc

    def json(self, *args: str) -> Any:
        """The decoded ``--json`` output of ``taskgate ARGS``."""
        return json.loads(self.run("--json", *args).stdout)

    def gate(self, *, app: bool) -> Gate:
        """A gate of this process on the store: the app's (not run), or one knowing every queue."""
        if app:
            return cli_app.make_gate(self.url, self.prefix)
        broker = cli_app.open_store(self.url, self.prefix)
        return Gate(Config(broker=broker, default_queue=QueueConfig(workers=1)))

    def call(self, method: str, *args: Any, app: bool = False, **kwargs: Any) -> Any:
        """One call of a gate's ``method`` made in this process (``app``: the app's gate, its routes)."""
        gate = self.gate(app=app)
        try:
            return anyio.run(lambda: getattr(gate, method)(*args, **kwargs))
        finally:
            gate.config.broker.close()


def cli(
    *args: str, env: dict[str, str] | None = None, cwd: Path = APP_DIR
) -> subprocess.CompletedProcess[str]:
    """Run ``python -m taskgate ARGS`` to its end."""
    command = [sys.executable, "-m", "taskgate", *args]
    return subprocess.run(command, capture_output=True, text=True, env=env, cwd=cwd, timeout=WAIT)


def _delete_redis_keys(prefix: str) -> None:
    import redis

    client = redis.Redis.from_url(REDIS_URL)
    try:
        keys = list(client.scan_iter(match=f"{prefix}*", count=500))
        if keys:
            client.delete(*keys)
    finally:
        client.close()


def _migrate(store: Store) -> None:
    env = {**os.environ, "TASKGATE_URL": store.url, "TASKGATE_PREFIX": store.prefix}
    proc = subprocess.run(
        [str(CONSOLE_SCRIPT), "migrate", "upgrade"], capture_output=True, text=True, env=env
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.endswith(f"(prefix {store.prefix}): upgraded from nothing to 0007\n"), proc.stdout


async def _seed(store: Store) -> None:
    gate = cli_app.make_gate(store.url, store.prefix)
    try:
        async with gate:
            ids = store.ids
            ids["ok"] = await gate.submit("ok", {"n": 1}, business_key=f"key-{store.name}")
            ids["child"] = await gate.submit("ok", {"n": 2}, depends_on=[ids["ok"]], group="g1")
            ids["boom"] = await gate.submit("boom", {"n": 3})
            assert await gate.wait_json(ids["child"], timeout=WAIT) == {"n": 2}
            with pytest.raises(TaskFailedError):
                await gate.wait(ids["boom"], timeout=WAIT)
    finally:
        gate.config.broker.close()


@pytest.fixture(scope="module", params=["sqlite", "postgresql", "mariadb", "redis"])
def store(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Store]:
    """One migrated, seeded store of each backend, shared by the module's tests."""
    with ExitStack() as stack:
        name = request.param
        if name == "sqlite":
            url = f"sqlite:///{tmp_path_factory.mktemp('cli') / 'tasks.db'}"
        elif name == "postgresql":
            require_postgresql()
            url = stack.enter_context(postgresql_database())
        elif name == "mariadb":
            require_mysql()
            url = stack.enter_context(mysql_database())
        else:
            require_redis()
            url = REDIS_URL
        prefix = f"cli{secrets.token_hex(3)}" + (":" if name == "redis" else "_")
        if name == "redis":
            stack.callback(_delete_redis_keys, prefix)
        store = Store(name, url, prefix)
        if name != "redis":
            _migrate(store)
        anyio.run(_seed, store)
        yield store


# -- reading ---------------------------------------------------------------------------------


def test_migrate_current_names_the_head_revision(store: Store) -> None:
    if store.name == "redis":
        proc = store.run("migrate", "current", code=1)
        assert (
            proc.stderr
            == "taskgate: error: migrations are for SQL stores; redis keeps no schema to migrate\n"
        )
    else:
        assert store.run("migrate", "current").stdout == "0007\n"


def test_overview_counts_tasks_by_type_and_status(store: Store) -> None:
    counts = store.json("overview")
    assert counts["boom"] == {s.value: (1 if s is Status.FAILED else 0) for s in Status}
    assert counts["ok"]["completed"] == 2

    lines = store.run("overview").stdout.splitlines()
    assert lines[0].split() == ["type", *(s.value for s in Status), "total"]
    assert "boom 0 0 0 0 0 1 0 1" in [" ".join(line.split()) for line in lines]


def test_stats_reads_a_queue_from_the_store_and_the_limits_from_the_app(store: Store) -> None:
    [work] = store.json("stats", "work")
    assert work == {"queue": "work", "queue_len": 0, "reachable": True, "paused_until": None, "unhandled": 0}

    [with_app] = store.json("--app", "cli_app:make_gate", "stats")
    assert with_app == {
        **work,
        "workers": 2,
        "rps": 0.0,
        "quota_limit": 0,
        "quota_used": 0,
        "quota_window_end": None,
        "quota_exhausted": False,
    }
    table = store.run("stats", "--app", "cli_app:make_gate").stdout.splitlines()
    header = "queue queue_len paused_until unhandled workers rps quota_used quota_limit quota_window_end"
    assert table[0].split() == header.split()
    assert table[1].split() == ["work", "0", "0", "2", "0.0", "0", "0"]


def test_list_filters_by_type_status_queue_group_key_and_pages(store: Store) -> None:
    ids = store.ids
    completed = store.json("list", "--type", "ok", "--status", "completed", "--queue", "work")
    assert [t["id"] for t in completed] == [ids["ok"], ids["child"]]
    assert completed[0]["result"] == {"n": 1} and completed[0]["status"] == "completed"
    assert [t["id"] for t in store.json("list", "--group", "g1")] == [ids["child"]]
    assert [t["id"] for t in store.json("list", "--key", f"key-{store.name}")] == [ids["ok"]]
    assert [t["id"] for t in store.json("list", "--type", "ok", "--limit", "1", "--offset", "1")] == [
        ids["child"]
    ]

    lines = store.run("list", "--queue", "work", "--type", "boom").stdout.splitlines()
    assert lines[0].split()[:4] == ["id", "type", "queue", "status"]
    assert lines[1].split()[:5] == [ids["boom"], "boom", "work", "failed", "1"]
    assert len(lines) == 2


def test_show_gives_payload_result_progress_and_dependencies(store: Store) -> None:
    ids = store.ids
    detail = store.json("show", ids["ok"])
    task = detail["task"]
    assert (task["id"], task["status"], task["payload"], task["result"]) == (
        ids["ok"],
        "completed",
        {"n": 1},
        {"n": 1},
    )
    assert task["progress"] == {"step": "done"} and task["claims"] == 1 and task["finished_at"]
    assert detail["children"] == [{"id": ids["child"], "type": "ok", "status": "completed"}]
    assert detail["replay_chain"] == [ids["ok"]] and detail["related_complete"] is True
    assert store.json("show", ids["child"])["parents"] == [
        {"id": ids["ok"], "type": "ok", "status": "completed"}
    ]

    human = store.run("show", ids["ok"]).stdout
    assert f"id:           {ids['ok']}" in human
    assert 'payload:\n    {\n      "n": 1\n    }\n' in human
    assert f"children:     {ids['child']}  ok  completed" in human


def test_show_gives_the_error_and_traceback_of_a_failed_task(store: Store) -> None:
    task = store.json("show", store.ids["boom"])["task"]
    assert task["status"] == "failed" and task["attempts"] == 1
    assert task["last_error"] == "RuntimeError: boom: {'n': 3}"
    assert task["last_traceback"].startswith("Traceback") and "in boom" in task["last_traceback"]

    human = store.run("show", store.ids["boom"]).stdout
    assert "last error:   RuntimeError: boom: {'n': 3}\ntraceback:\n    Traceback" in human


# -- changing --------------------------------------------------------------------------------


def test_cancel_then_replay_makes_a_new_execution_in_the_chain(store: Store) -> None:
    parent = store.call("submit", "parked", {"x": 1})
    child = store.call("submit", "parked", None, depends_on=[parent])

    assert store.run("cancel", parent).stdout == f"{parent}  canceled\n"
    assert store.call("get", child).status is Status.CANCELED
    replayed = store.json("replay", parent)
    assert replayed["replay_of"] == parent

    detail = store.json("show", replayed["id"])
    assert detail["task"]["status"] == "pending" and detail["task"]["replay_of"] == parent
    assert detail["replay_chain"] == [parent, replayed["id"]]
    assert store.json("show", parent)["replay_chain"] == [parent, replayed["id"]]
    [canceled] = store.json("cancel", replayed["id"])
    assert canceled["status"] == "canceled"
    new_id = store.run("replay", replayed["id"]).stdout.strip()
    assert store.call("get", new_id).replay_of == replayed["id"]


def test_cancel_and_replay_by_filter_act_on_each_matching_task(store: Store) -> None:
    kind = f"bulk{secrets.token_hex(2)}"
    parent = store.call("submit", kind, None)
    child = store.call("submit", kind, None, depends_on=[parent])  # blocked: not matched below
    other = store.call("submit", kind, None)

    assert store.json("cancel", "--type", kind, "--status", "pending") == {"canceled": 2}
    assert store.call("get", other).status is Status.CANCELED
    assert store.call("get", child).status is Status.CANCELED  # with its parent
    assert store.run("cancel", "--type", kind).stdout == "canceled 0 tasks\n"  # nothing left

    pairs = store.json("replay", "--type", kind, "--status", "canceled")
    assert sorted(p["replay_of"] for p in pairs) == sorted([parent, child, other])
    new = {p["replay_of"]: p["id"] for p in pairs}
    assert store.call("get", new[parent]).status is Status.PENDING
    assert store.call("get", new[other]).status is Status.PENDING
    # the child was re-run with its parent, waiting for the new one (not born canceled)
    assert store.call("get", new[child]).depends_on == (new[parent],)
    lines = store.run("replay", "--type", kind, "--status", "canceled").stdout.splitlines()
    assert parent not in "".join(lines)  # its replay is the newest of its chain now
    store.json("cancel", "--type", kind)


def test_purge_deletes_the_final_tasks_the_filter_names(store: Store) -> None:
    keep = store.call("submit", "purgeme", None)
    gone = [store.call("submit", "purgeme", None) for _ in range(3)]
    for task_id in gone:
        store.call("cancel", task_id)

    assert store.json("purge", "--type", "purgeme", "--older-than", "1h") == {"purged": 0}
    assert (
        store.run("purge", "--type", "purgeme", "--status", "canceled", "--limit", "2").stdout
        == "purged 2 tasks\n"
    )
    assert store.json("purge", "--type", "purgeme") == {"purged": 1}
    assert [t.id for t in store.call("list", type="purgeme")] == [keep]


def test_pause_holds_a_queue_until_resumed(store: Store) -> None:
    queue = f"pq{secrets.token_hex(2)}"
    flags = ("--url", store.url, "--prefix", store.prefix)

    paused = json.loads(store.run(*flags, "--json", "pause", queue, "--for", "10m", use_env=False).stdout)
    assert paused["queue"] == queue and paused["paused_until"] > "2000"
    assert store.run("pause", queue).stdout == f"paused {queue} until resumed\n"
    [stats] = store.json("stats", queue)
    assert stats["paused_until"].startswith("9999-12-31")
    assert "until resumed" in store.run("stats", queue).stdout

    assert store.run("resume", queue, *flags, use_env=False).stdout == f"resumed {queue}\n"
    assert store.json("stats", queue)[0]["paused_until"] is None
    assert store.json("resume", queue) == {"queue": queue, "paused_until": None}  # not held: no change


# -- the worker ------------------------------------------------------------------------------


def _wait_for(path: Path, proc: subprocess.Popen[str]) -> None:
    deadline = time.monotonic() + WAIT
    while not path.exists():
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, f"{path} did not appear"
        time.sleep(0.02)


@pytest.mark.parametrize(
    ("stop", "loop"), [(signal.SIGTERM, "asyncio"), (signal.SIGINT, "trio")], ids=["SIGTERM", "SIGINT-trio"]
)
def test_a_stopped_worker_puts_its_running_task_back_untouched(
    store: Store, stop: signal.Signals, loop: str, tmp_path: Path
) -> None:
    if stop is signal.SIGINT and store.name != "sqlite":
        pytest.skip("SIGINT and Trio take the same path as SIGTERM on asyncio: one store is enough")
    started = tmp_path / "started"
    done = store.call("submit", "ok", {"n": 4}, app=True)
    held = store.call("submit", "hold", {"started": str(started)}, app=True)
    env = {**os.environ, "TASKGATE_URL": store.url, "TASKGATE_PREFIX": store.prefix}
    command = [sys.executable, "-m", "taskgate", "worker", "cli_app:make_gate", "--shutdown-timeout", "0.2"]
    command += ["--backend", loop, "--queues", "work"]
    with subprocess.Popen(command, cwd=APP_DIR, env=env, stderr=subprocess.PIPE, text=True) as proc:
        try:
            _wait_for(started, proc)
            assert store.call("wait_json", done, timeout=WAIT) == {"n": 4}
            proc.send_signal(stop)
            _, stderr = proc.communicate(timeout=WAIT)
        finally:
            proc.kill()

    assert proc.returncode == 0, stderr
    assert "Traceback" not in stderr and f"{stop.name}: stopping" in stderr
    task = store.call("get", held)
    assert (task.status, task.attempts, task.throttled, task.lease_lost) == (Status.PENDING, 0, 0, 0)
    assert task.last_error is None and task.result is None
    store.call("cancel", held)  # not left for a later test's worker


def test_a_worker_for_a_queue_the_app_does_not_have_is_one_line_and_exit_1(store: Store) -> None:
    env = {**os.environ, "TASKGATE_URL": store.url, "TASKGATE_PREFIX": store.prefix}
    proc = cli("worker", "cli_app:make_gate", "--queues", "work,nowhere", env=env)
    _assert_one_line_error(proc, "unknown queue 'nowhere'")


# -- errors ----------------------------------------------------------------------------------


def _assert_one_line_error(proc: subprocess.CompletedProcess[str], *fragments: str) -> None:
    assert proc.returncode == 1, (proc.stdout, proc.stderr)
    assert proc.stdout == ""
    assert proc.stderr.startswith("taskgate: error: ") and proc.stderr.count("\n") == 1, proc.stderr
    assert "Traceback" not in proc.stderr
    for fragment in fragments:
        assert fragment in proc.stderr


UNREACHABLE = {
    "postgresql": "postgresql://postgres@127.0.0.1:1/test",
    "mariadb": "mysql://root@127.0.0.1:1/test",
    "redis": "redis://127.0.0.1:1/0",
    "sqlite": "sqlite:////nonexistent-taskgate-dir/tasks.db",
}


@pytest.mark.parametrize("command", [["list"], ["stats", "work"], ["migrate", "current"]], ids=" ".join)
@pytest.mark.parametrize("backend", list(UNREACHABLE))
def test_an_unreachable_store_is_one_line_and_exit_1(backend: str, command: list[str]) -> None:
    if command[0] == "migrate" and backend == "redis":
        pytest.skip("migrations are for SQL stores")
    _assert_one_line_error(cli("--url", UNREACHABLE[backend], *command))


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["frobnicate"], "invalid choice: 'frobnicate'"),
        (["list", "--limit", "-1"], "Filter.limit must be >= 0"),
        (["list", "--status", "lost"], "invalid choice: 'lost'"),
        (["pause", "q", "--for", "soon"], "argument --for"),
        (["purge", "--status", "pending"], "invalid choice: 'pending'"),
        (["--url", "ftp://host/x", "list"], "unknown store scheme 'ftp'"),
        (["cancel"], "give task ids or filter options"),
        (["cancel", "01ID", "--type", "x"], "not both"),
        (["replay", "--type", "x"], "a filter needs --status"),
        (["replay", "--status", "completed"], "only with --allow-completed"),
        (["worker", "no_such_module:gate"], "no module named 'no_such_module'"),
        (["worker", "cli_app"], "expected MODULE:GATE"),
        (["worker", "cli_app:nothing"], "has no attribute 'nothing'"),
        (["worker", "cli_app:QUEUE"], "is a str, not a taskgate.Gate"),
    ],
    ids=lambda value: " ".join(value) if isinstance(value, list) else None,
)
def test_bad_input_is_one_line_and_exit_1(args: list[str], fragment: str, tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TASKGATE_")}
    env["TASKGATE_URL"] = f"sqlite:///{tmp_path / 'tasks.db'}"
    _assert_one_line_error(cli(*args, env=env), fragment)


def test_no_store_named_is_one_line_and_exit_1() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TASKGATE_")}
    _assert_one_line_error(cli("overview", env=env), "pass --url or set TASKGATE_URL")


def test_operations_the_store_refuses_are_one_line_and_exit_1(store: Store) -> None:
    pending = store.call("submit", "parked", None)
    for args, fragment in [
        (["show", "01NOSUCHTASK"], "TaskNotFoundError"),
        (["replay", pending], "ReplayNotFinalError"),
        (["cancel", store.ids["ok"]], "AlreadyFinalError"),
        (["replay", store.ids["ok"]], "CompletedNotAllowedError"),
    ]:
        _assert_one_line_error(store.run(*args, code=1), fragment)
    store.call("cancel", pending)


def test_taskgate_migrate_stays_an_alias_that_says_what_it_did(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'tasks.db'}"
    alias = Path(sys.executable).with_name("taskgate-migrate")

    def run(*args: str) -> str:
        proc = subprocess.run([str(alias), *args], capture_output=True, text=True, timeout=WAIT)
        assert proc.returncode == 0 and proc.stderr == "", proc.stderr
        return proc.stdout

    assert (
        run("upgrade", url, "--prefix", "alias_") == f"{url} (prefix alias_): upgraded from nothing to 0007\n"
    )
    assert run("upgrade", url, "--prefix", "alias_") == f"{url} (prefix alias_): already at 0007\n"
    assert run("downgrade", url, "0005", "--prefix", "alias_").endswith("downgraded from 0007 to 0005\n")
    assert run("current", url, "--prefix", "alias_") == "0005\n"


# -- the dashboard ---------------------------------------------------------------------------


def test_dashboard_serves_the_store_until_sigterm(store: Store) -> None:
    # (The pages themselves are tested in tests/dashboard; this is the command serving them.)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    env = {**os.environ, "TASKGATE_URL": store.url, "TASKGATE_PREFIX": store.prefix}
    command = [sys.executable, "-m", "taskgate", "dashboard", "--port", str(port)]
    proc = subprocess.Popen(command, env=env, cwd=APP_DIR, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        page = _get_when_up(f"http://127.0.0.1:{port}/tasks/{store.ids['boom']}", proc)
        assert store.ids["boom"] in page and "failed" in page
        assert "<form" not in page  # read-only without --allow-actions
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=WAIT)
    assert proc.returncode == 0, err
    assert b"Traceback" not in err


def _get_when_up(url: str, proc: subprocess.Popen[bytes]) -> str:
    """The page at ``url`` once the server answers (it fails the test if the server exits)."""
    deadline = time.monotonic() + WAIT
    while True:
        try:
            with urllib.request.urlopen(url, timeout=WAIT) as response:
                return str(response.read().decode())
        except OSError:
            assert proc.poll() is None, proc.communicate()[1].decode()
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)  # the server is starting: nothing to wait on but its port
