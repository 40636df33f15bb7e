"""Loading the Lua scripts, running them, and the one edge where redis-py errors are translated.

Each script is a ``.lua`` file in ``lua/``, shipped as package data. The shared helpers in
``lua/_lib.lua`` are prepended to every script at load time (Redis has no ``require``), so a
script's error line numbers are offset by the library's length. The body runs as a function,
so the library's deferred status writes are flushed after it whichever ``return`` it took.
Scripts are registered with redis-py's ``register_script``: calls go by ``EVALSHA`` and the
script body is sent again only when the server answers ``NOSCRIPT`` (first use, or after a
restart/``SCRIPT FLUSH``).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from importlib import resources
from typing import Any

from redis.exceptions import RedisError

from taskgate.brokers.redis.codec import SNAPSHOT_FIELDS
from taskgate.errors import BrokerError

__all__ = ["CHAINED", "SCRIPT_NAMES", "ScriptBook", "chain", "library", "redis_errors"]

SCRIPT_NAMES = (
    "ack",
    "ack_many",
    "cancel",
    "claim",
    "claim_limited",
    "claim_quota",
    "enqueue",
    "fail",
    "finish_canceled",
    "heartbeat",
    "history",
    "list",
    "next_due",
    "quota_release",
    "quota_reserve",
    "rate_take",
    "reap",
    "replay",
    "requeue",
    "retry",
    "slots_acquire",
    "slots_renew",
)

# Scripts made of two: the first's body, then -- only when it answered "ok" -- the second's,
# in one EVALSHA (see `chain`).
CHAINED = {"enqueue_claim_limited": ("enqueue", "claim_limited")}

Arg = str | bytes | int | float


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


_EPILOGUE = "local reply = main()\nflush_status()\npublish_signals()\nreturn reply\n"


def wrap(library: str, body: str) -> str:
    """One script: the library, then ``body`` as a function whose reply is returned after the
    library's deferred status writes (`flush_status`) and wake-ups (`publish_signals`) --
    whichever ``return`` the body took."""
    return f"{library}\nlocal function main()\n{body}\nend\n{_EPILOGUE}"


def chain(library: str, first: str, second: str) -> str:
    """One script running ``first``'s body, then ``second``'s if the first answered "ok"
    (``lua/_chain.lua`` says how arguments are split and what it replies)."""
    template = read_lua("_chain").replace("--[[FIRST]]", first).replace("--[[SECOND]]", second)
    return f"{library}\n{template}\n{_EPILOGUE}"


def library() -> str:
    """``lua/_lib.lua`` with the codec's `SNAPSHOT_FIELDS` written above it, as the Lua list
    ``SNAPSHOT_FIELDS`` and the table ``AT`` (field name -> position)."""
    names = ", ".join(f"'{name}'" for name in SNAPSHOT_FIELDS)
    positions = ", ".join(f"{name} = {n}" for n, name in enumerate(SNAPSHOT_FIELDS, 1))
    return f"local SNAPSHOT_FIELDS = {{ {names} }}\nlocal AT = {{ {positions} }}\n{read_lua('_lib')}"


class ScriptBook:
    """Every taskgate script registered on one client; `run` calls one by name."""

    def __init__(self, client: Any) -> None:
        lib = library()
        self._scripts = {name: client.register_script(wrap(lib, read_lua(name))) for name in SCRIPT_NAMES}
        for name, (first, second) in CHAINED.items():
            self._scripts[name] = client.register_script(chain(lib, read_lua(first), read_lua(second)))

    def run(self, name: str, base: str, args: Sequence[Arg]) -> list[Any]:
        """Run script ``name`` with ``KEYS[1] = base`` and ``args``; return its reply list."""
        with redis_errors(f"script {name}"):
            reply = self._scripts[name](keys=[base], args=list(args))
        return list(reply)
