"""The Lua scripts as one Redis function library: building it, loading it, calling it, and the
one edge where redis-py errors are translated.

Each script is a ``.lua`` file in ``lua/``, shipped as package data. The loader makes ONE
function library of them (`function_library`): the shared helpers of ``lua/_lib.lua`` once,
then each script's body registered as a function. The server compiles and runs the library
once, at ``FUNCTION LOAD``; a call is an ``FCALL``. (Scripts sent by ``EVALSHA`` had to carry
the helpers and define them again on every call: ≈ 25 µs of server time per call here, a tenth
of a claim.) The library's name and its functions' names carry a hash of its source, so
processes of two taskgate versions sharing a server during a redeploy each call their own.

The library is loaded on first use and again whenever the server answers "Function not found"
(a restart without persistence, ``FUNCTION FLUSH``); two processes loading it at once is fine:
both load the same source. Needs Redis 7.0 or later (functions are new in 7.0).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from importlib import resources
from typing import Any, TypeVar

from redis.exceptions import RedisError, ResponseError

from taskgate.brokers.redis.codec import SNAPSHOT_FIELDS
from taskgate.brokers.redis.split import MAX_SPLIT_REQUEST, LoopConnections, PendingReply, pack_request
from taskgate.brokers.split import SplitCall
from taskgate.errors import BrokerError

__all__ = [
    "CHAINED",
    "READ_ONLY",
    "SCRIPT_NAMES",
    "FunctionLibrary",
    "ScriptBook",
    "function_library",
    "redis_errors",
]

SCRIPT_NAMES = (
    "ack_many",
    "cancel",
    "claim",
    "claim_limited",
    "claim_quota",
    "enqueue",
    "heartbeat",
    "hold",
    "list",
    "next_due",
    "prune",
    "queue_state",
    "reap",
    "replay",
    "settle",
    "step",
)

# Scripts that only read: registered 'no-writes', so Redis runs them when its memory is full.
READ_ONLY = frozenset({"list", "next_due", "queue_state"})

# Scripts made of two: the first's body, then -- only when it answered "ok" -- the second's,
# in one FCALL (see ``lua/_chain.lua``).
CHAINED = {
    "ack_claim": ("ack_many", "claim"),
    "ack_claim_quota": ("ack_many", "claim_quota"),
    "ack_claim_limited": ("ack_many", "claim_limited"),
}

Arg = str | bytes | int | float
T = TypeVar("T")

_MISSING = "Function not found"


@contextmanager
def redis_errors(what: str) -> Iterator[None]:
    """Translate every redis-py error raised inside the block to `BrokerError` (chained)."""
    try:
        yield
    except RedisError as exc:
        raise BrokerError(f"Redis {what} failed: {type(exc).__name__}: {exc}") from exc


def read_lua(name: str) -> str:
    """The text of ``lua/<name>.lua`` from the installed package."""
    return (resources.files(__package__) / "lua" / f"{name}.lua").read_text(encoding="utf-8")


def _registered(name: str, main: str) -> str:
    """Lua defining ``main`` (a function) and registering it as script ``name``, in a block of
    its own so no script's locals reach another's."""
    flags = ", { 'no-writes' }" if name in READ_ONLY else ""
    return f"do\n{main}\nregister('{name}', main{flags})\nend\n"


def _script(body: str) -> str:
    return read_lua("_script").replace("--[[BODY]]", body)


def _chained(first: str, second: str) -> str:
    return read_lua("_chain").replace("--[[FIRST]]", first).replace("--[[SECOND]]", second)


@dataclass(frozen=True, slots=True)
class FunctionLibrary:
    """The source of taskgate's function library and the names it registers."""

    name: str
    source: str

    def function(self, script: str) -> str:
        """The registered name of ``script`` (one of `SCRIPT_NAMES` or `CHAINED`)."""
        return f"{self.name}_{script}"


def function_library() -> FunctionLibrary:
    """The library: ``lua/_lib.lua`` with the codec's `SNAPSHOT_FIELDS` written above it (the Lua
    list ``SNAPSHOT_FIELDS`` and the table ``AT``, field name -> position) and the functions'
    name prefix (``FUNCTION_PREFIX``), then every script and chained pair, registered."""
    names = ", ".join(f"'{name}'" for name in SNAPSHOT_FIELDS)
    positions = ", ".join(f"{name} = {n}" for n, name in enumerate(SNAPSHOT_FIELDS, 1))
    parts = [f"local SNAPSHOT_FIELDS = {{ {names} }}\nlocal AT = {{ {positions} }}\n", read_lua("_lib")]
    parts += [_registered(name, _script(read_lua(name))) for name in SCRIPT_NAMES]
    parts += [
        _registered(name, _chained(read_lua(first), read_lua(second)))
        for name, (first, second) in CHAINED.items()
    ]
    body = "\n".join(parts)
    name = "taskgate_" + hashlib.sha1(body.encode(), usedforsecurity=False).hexdigest()[:16]
    header = f"#!lua name={name}\nlocal FUNCTION_PREFIX = '{name}_'\n"
    return FunctionLibrary(name, header + body)


class ScriptBook:
    """taskgate's function library on one client; `run` calls one script by name, `start`
    sends a call whose reply the event loop reads (`taskgate.brokers.split`); `command` and
    `start_command` do the same for a plain command."""

    def __init__(self, client: Any) -> None:
        self._client = client
        self._library = function_library()
        self.loop_connections = LoopConnections(client)

    def run(self, name: str, base: str, args: Sequence[Arg]) -> list[Any]:
        """Run script ``name`` with ``KEYS[1] = base`` and ``args``; return its reply list."""
        function = self._library.function(name)
        with redis_errors(f"script {name}"):
            try:
                reply = self._client.fcall(function, 1, base, *args)
            except ResponseError as exc:
                # Nothing ran: the server has not got the library (first use, or it lost it).
                if str(exc) != _MISSING:
                    raise
                self.load()
                reply = self._client.fcall(function, 1, base, *args)
        # A broker thread, and the server just answered: where a connection for split calls
        # opens (never before the call, which must fail within one socket timeout).
        self.loop_connections.top_up()
        return list(reply)

    def start(
        self, name: str, base: str, args: Sequence[Arg], answer: Callable[[list[Any]], T]
    ) -> SplitCall[T] | None:
        """Send script ``name``'s call on an idle event-loop connection; the reply goes to
        ``answer``. None when no connection is idle or the request is too big (nothing sent)."""
        return self._send(f"script {name}", ("FCALL", self._library.function(name), 1, base, *args), answer)

    def command(self, what: str, request: Sequence[Arg]) -> Any:
        """Run a plain command (``request``: its name and arguments) in this thread, as `run`
        runs a script; its reply. ``what`` names the call in errors."""
        with redis_errors(what):
            reply = self._client.execute_command(*request)
        self.loop_connections.top_up()  # as after a script: the server just answered
        return reply

    def start_command(
        self, what: str, request: Sequence[Arg], answer: Callable[[Any], T]
    ) -> SplitCall[T] | None:
        """`start` for a plain command (a read that needs no script)."""
        return self._send(what, request, answer)

    def _send(self, what: str, request: Sequence[Arg], answer: Callable[[Any], T]) -> SplitCall[T] | None:
        connection = self.loop_connections.take()
        if connection is None:
            return None
        packed = pack_request(connection, request)
        if sum(len(part) for part in packed) > MAX_SPLIT_REQUEST:
            self.loop_connections.give_back(connection)
            return None
        try:
            with redis_errors(what):
                connection.send_packed_command(packed, check_health=False)
        except BrokerError:
            self.loop_connections.drop(connection)
            raise
        pending = PendingReply(self.loop_connections, connection, what, answer)
        return SplitCall(pending.fileno(), pending.receive, pending.result, timeout=pending.timeout)

    def load(self) -> None:
        """``FUNCTION LOAD`` the library. With ``REPLACE``: a copy loaded meanwhile by another
        process has the same source (the name is its hash), and on a Cluster a node that lacks
        it must not be skipped because another node has it."""
        self._client.function_load(self._library.source, replace=True)
