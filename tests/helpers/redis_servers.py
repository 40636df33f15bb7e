"""Private Redis servers for tests that must kill, restart or cluster a server.

The shared Redis (``redis_url`` fixture) is never restarted or flushed; tests that need to
break a server start their own here: `RedisServer` is one ``redis-server`` on a free loopback
port in a temp dir; `RedisClusterNodes` is three cluster-enabled servers joined with
``redis-cli --cluster create`` (no replicas). Both stop their processes on `stop`.
"""

from __future__ import annotations

import random
import shutil
import socket
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path

import redis

__all__ = ["RedisClusterNodes", "RedisServer", "free_port", "have_redis_server"]

_START_DEADLINE = 10.0


def have_redis_server() -> bool:
    """True when ``redis-server`` and ``redis-cli`` are on PATH."""
    return shutil.which("redis-server") is not None and shutil.which("redis-cli") is not None


def _bindable(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_port(*, with_bus: bool = False) -> int:
    """A loopback port nobody listens on (and port + 10000 too, for a cluster bus)."""
    for _ in range(200):
        port = random.randint(20000, 29999)
        if _bindable(port) and (not with_bus or _bindable(port + 10000)):
            return port
    raise RuntimeError("no free loopback port found")


class RedisServer:
    """One ``redis-server`` on 127.0.0.1:``port`` with its data in ``directory``.

    ``appendonly=True`` persists every write (fsync always), so data survives a SIGKILL and a
    restart on the same port and directory.
    """

    def __init__(
        self, directory: Path, *, port: int | None = None, appendonly: bool = False, extra: Sequence[str] = ()
    ) -> None:
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.port = port if port is not None else free_port(with_bus=bool(extra))
        self.appendonly = appendonly
        self.extra = tuple(extra)
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        """``redis://127.0.0.1:<port>/0``."""
        return f"redis://127.0.0.1:{self.port}/0"

    def _command(self) -> list[str]:
        persistence = ["--appendonly", "yes", "--appendfsync", "always"] if self.appendonly else []
        return [
            "redis-server",
            "--port", str(self.port),
            "--bind", "127.0.0.1",
            "--dir", str(self.directory),
            "--save", "",
            "--logfile", "redis.log",
            *persistence,
            *self.extra,
        ]  # fmt: skip

    def start(self) -> RedisServer:
        """Start the server and return once it answers PING (or raise after a deadline)."""
        self.process = subprocess.Popen(self._command(), cwd=self.directory)
        client = redis.Redis(port=self.port, socket_timeout=1, socket_connect_timeout=1)
        deadline = time.monotonic() + _START_DEADLINE
        try:
            while time.monotonic() < deadline:
                if self.process.poll() is not None:
                    raise RuntimeError(f"redis-server exited at start: {self._log_tail()}")
                try:
                    client.ping()
                    return self
                except (redis.ConnectionError, redis.exceptions.BusyLoadingError):
                    time.sleep(0.02)
        finally:
            client.close()
        raise RuntimeError(f"redis-server did not answer within {_START_DEADLINE}s: {self._log_tail()}")

    def _log_tail(self) -> str:
        log = self.directory / "redis.log"
        return log.read_text()[-2000:] if log.exists() else "(no log)"

    def kill(self) -> None:
        """SIGKILL the server and wait for it: a crash, no shutdown save."""
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=10)
        self.process = None

    def stop(self) -> None:
        """Stop the server (SIGTERM, then SIGKILL after a few seconds)."""
        if self.process is None:
            return
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=5)
        self.process = None


class RedisClusterNodes:
    """Three cluster-enabled ``redis-server`` nodes covering all 16384 slots, no replicas."""

    def __init__(self, directory: Path, size: int = 3) -> None:
        flags = ["--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf"]
        flags += ["--cluster-node-timeout", "2000"]
        self.nodes = [RedisServer(Path(directory) / f"node{i}", extra=flags) for i in range(size)]

    @property
    def startup(self) -> tuple[str, int]:
        """Host and port of the first node, enough for ``RedisCluster`` to discover the rest."""
        return "127.0.0.1", self.nodes[0].port

    def start(self) -> RedisClusterNodes:
        """Start the nodes, join them, and return once every node reports ``cluster_state:ok``."""
        try:
            for node in self.nodes:
                node.start()
            self._create()
            self._await_ok()
        except BaseException:
            self.stop()
            raise
        return self

    def _create(self) -> None:
        addresses = [f"127.0.0.1:{n.port}" for n in self.nodes]
        subprocess.run(
            ["redis-cli", "--cluster", "create", *addresses, "--cluster-replicas", "0", "--cluster-yes"],
            check=True,
            capture_output=True,
            timeout=30,
        )

    def _await_ok(self) -> None:
        deadline = time.monotonic() + _START_DEADLINE
        clients = [redis.Redis(port=n.port, socket_timeout=1) for n in self.nodes]
        try:
            while time.monotonic() < deadline:
                if all(c.cluster("INFO")["cluster_state"] == "ok" for c in clients):
                    return
                time.sleep(0.05)
        finally:
            for c in clients:
                c.close()
        raise RuntimeError("the test cluster did not reach cluster_state:ok")

    def stop(self) -> None:
        """Stop every node."""
        for node in self.nodes:
            node.stop()


def purge_keys(client: redis.Redis | redis.RedisCluster, pattern: str) -> int:
    """Delete every key matching ``pattern`` (a test's own prefix); return how many.

    Keys of one broker share a hash tag, so on a cluster they all live on one node and
    ``SCAN`` over the cluster finds them.
    """
    keys = list(client.scan_iter(match=pattern, count=1000))
    for key in keys:
        client.delete(key)
    return len(keys)


def purge_prefix(url: str, key_prefix: str) -> None:
    """Delete every key a broker with ``key_prefix`` wrote on the server at ``url``."""
    from taskgate.brokers.redis.keys import KeySpace

    client = redis.Redis.from_url(url)
    try:
        purge_keys(client, KeySpace(key_prefix).pattern())
    finally:
        client.close()
