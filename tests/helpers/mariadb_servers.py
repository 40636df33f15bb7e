"""A private MariaDB server for tests that need server settings the shared one must keep.

Some settings are the server's alone: ``max_allowed_packet`` is GLOBAL (a session cannot set
its own), and changing it on the shared server would change it for every test running there.
`MariaDBServer` is one ``mariadbd`` on a free loopback port, with its own data directory made
by ``mariadb-install-db`` in a temp dir (about a second for both), started with the options
the test gives; `stop` ends it.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path

import pymysql
import pytest

from helpers.redis_servers import free_port

__all__ = ["MariaDBServer", "require_mariadb_binaries"]

_START_DEADLINE = 30.0
_SEARCH_PATH = os.pathsep.join([os.environ.get("PATH", ""), "/usr/sbin", "/usr/local/sbin"])


def _which(name: str) -> str | None:
    return shutil.which(name, path=_SEARCH_PATH)


def require_mariadb_binaries() -> None:
    """Skip (locally) or fail (in CI, ``CI`` set) unless ``mariadbd`` and ``mariadb-install-db``
    are installed."""
    if _which("mariadbd") and _which("mariadb-install-db"):
        return
    message = "mariadbd and mariadb-install-db are needed for a private MariaDB server"
    if os.environ.get("CI"):
        pytest.fail(f"{message}; CI must run every backend", pytrace=False)
    pytest.skip(message)


class MariaDBServer:
    """One ``mariadbd`` on 127.0.0.1:``port``, root without a password, data in ``directory``."""

    def __init__(self, directory: Path, *, options: Sequence[str] = ()) -> None:
        self.directory = Path(directory)
        self.port = free_port()
        self.options = tuple(options)
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        """The server's SQLAlchemy URL (PyMySQL), naming no database."""
        return f"mysql+pymysql://root@127.0.0.1:{self.port}"

    def start(self) -> MariaDBServer:
        """Make the data directory (unless a `crash` left one), start the server and wait
        until it answers (after a crash, InnoDB recovers from its redo log first)."""
        data = self.directory / "data"
        if not data.exists():
            self._install(data)
        self._launch(data)
        return self

    def _install(self, data: Path) -> None:
        install = [
            _which("mariadb-install-db") or "mariadb-install-db",
            "--no-defaults",
            f"--datadir={data}",
            "--user=root",
            "--auth-root-authentication-method=normal",
            "--skip-test-db",
            "--skip-name-resolve",
        ]
        subprocess.run(install, check=True, capture_output=True, timeout=120)

    def _launch(self, data: Path) -> None:
        self.process = subprocess.Popen(
            [
                _which("mariadbd") or "mariadbd",
                "--no-defaults",
                f"--datadir={data}",
                f"--port={self.port}",
                "--bind-address=127.0.0.1",
                f"--socket={self.directory / 'mariadb.sock'}",
                f"--pid-file={self.directory / 'mariadb.pid'}",
                f"--log-error={self.directory / 'error.log'}",
                "--user=root",
                "--skip-name-resolve",
                "--innodb-buffer-pool-size=32M",
                "--innodb-log-file-size=16M",
                *self.options,
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + _START_DEADLINE
        while True:
            try:
                pymysql.connect(host="127.0.0.1", port=self.port, user="root", connect_timeout=2).close()
                return
            except pymysql.err.OperationalError:
                if self.process.poll() is not None or time.monotonic() > deadline:
                    log = (self.directory / "error.log").read_text(errors="replace")[-2000:]
                    self.stop()
                    raise RuntimeError(f"private MariaDB did not start: {log}") from None
                time.sleep(0.05)

    def crash(self) -> None:
        """SIGKILL the server: no shutdown, only what InnoDB flushed survives (`start` again
        recovers)."""
        assert self.process is not None, "the server is not running"
        self.process.kill()
        self.process.wait(timeout=30)
        self.process = None

    def stop(self) -> None:
        """End the server (its data directory goes with the temp dir)."""
        if self.process is None:
            return
        self.process.terminate()
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(timeout=30)
        self.process = None
