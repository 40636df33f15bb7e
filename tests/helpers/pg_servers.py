"""A private PostgreSQL server for tests that must crash a server and start it again.

The shared PostgreSQL (``postgresql_url`` fixture) is never stopped; a test that needs to kill
a server starts its own here: `PostgresServer` is one ``postgres`` (cluster made by ``initdb``)
on a free loopback port, its data in a temp dir. `crash` SIGKILLs every process of the server
at once (a power cut, as far as the server's processes can tell: WAL still in its buffers is
gone, WAL handed to the OS survives); `start` again runs crash recovery.

Run as root (as CI does), the server runs as the ``postgres`` user: ``initdb`` refuses root.
"""

from __future__ import annotations

import os
import pwd
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import psycopg

from helpers.redis_servers import free_port

__all__ = ["PostgresServer", "postgres_binaries"]

_START_DEADLINE = 30.0


def postgres_binaries() -> Path | None:
    """The directory holding ``initdb`` and ``postgres``, or None when they are not installed."""
    initdb = shutil.which("initdb")
    if initdb is None:
        found = sorted(Path("/usr/lib/postgresql").glob("*/bin/initdb"))
        if not found:
            return None
        initdb = str(found[-1])
    directory = Path(os.path.realpath(initdb)).parent
    return directory if (directory / "postgres").exists() else None


class PostgresServer:
    """One private ``postgres`` on 127.0.0.1:``port``; ``settings`` are extra ``-c`` options."""

    def __init__(self, *, settings: Sequence[str] = ()) -> None:
        binaries = postgres_binaries()
        if binaries is None:
            raise RuntimeError("initdb/postgres are not installed")
        self._bin = binaries
        self._user = "postgres" if os.geteuid() == 0 else None
        # Not the test's tmp_path: as root, pytest's temp dirs are closed to the postgres user.
        self.directory = Path(tempfile.mkdtemp(prefix="taskgate-pg-"))
        self.data = self.directory / "data"
        self.port = free_port()
        self.settings = tuple(settings)
        self.process: subprocess.Popen[bytes] | None = None
        if self._user is not None:
            entry = pwd.getpwnam(self._user)
            os.chown(self.directory, entry.pw_uid, entry.pw_gid)
        subprocess.run(
            [str(self._bin / "initdb"), "-D", str(self.data), "-A", "trust", "-U", "postgres", "--no-sync"],
            user=self._user,
            check=True,
            capture_output=True,
        )

    @property
    def url(self) -> str:
        """A SQLAlchemy URL (psycopg 3) of the server's ``postgres`` database."""
        return f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/postgres"

    def start(self) -> PostgresServer:
        """Start the server (after a `crash`, this recovers from the WAL); wait until it answers."""
        options = [
            "-p", str(self.port),
            "-c", "listen_addresses=127.0.0.1",
            "-c", f"unix_socket_directories={self.directory}",
        ]  # fmt: skip
        for setting in self.settings:
            options += ["-c", setting]
        log = open(self.directory / "server.log", "ab")  # the server writes to it
        self.process = subprocess.Popen(
            [str(self._bin / "postgres"), "-D", str(self.data), *options],
            user=self._user,
            stdout=log,
            stderr=log,
            start_new_session=True,  # no signal meant for the test process (Ctrl-C) reaches it
        )
        log.close()
        deadline = time.monotonic() + _START_DEADLINE
        while True:
            try:
                psycopg.connect(f"host=127.0.0.1 port={self.port} user=postgres dbname=postgres").close()
                return self
            except psycopg.OperationalError:
                if self.process.poll() is not None or time.monotonic() > deadline:
                    message = f"private postgres did not start: see {self.directory / 'server.log'}"
                    raise RuntimeError(message) from None
                time.sleep(0.02)

    def crash(self) -> None:
        """SIGKILL the postmaster and every backend and helper process at once.

        Not by process group: each child of the postmaster makes itself a group (and session)
        leader, so killing the postmaster's group leaves the backends running -- attached to
        the shared memory (a start then refuses) and still able to commit. Every process of
        this server works in its data directory, so that finds them all; the postmaster is
        stopped first, so it forks none while they are listed.
        """
        assert self.process is not None, "the server is not running"
        postmaster = self.process.pid
        os.kill(postmaster, signal.SIGSTOP)
        deadline = time.monotonic() + _START_DEADLINE
        while (pids := _working_in(self.data)) and time.monotonic() < deadline:
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass  # it ended meanwhile
            time.sleep(0.01)
        self.process.wait()
        self.process = None

    def stop(self) -> None:
        """Stop the server (if running) and delete its files."""
        if self.process is not None:
            self.crash()
        shutil.rmtree(self.directory, ignore_errors=True)


def _working_in(directory: Path) -> list[int]:
    """The live processes (zombies hold nothing) whose working directory is ``directory``."""
    target = os.path.realpath(directory)
    found = []
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            if os.readlink(proc / "cwd") != target:
                continue
            state = (proc / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue  # it ended meanwhile, or is not ours to read
        if state != "Z":
            found.append(int(proc.name))
    return found
