"""Script calls for the event loop (`taskgate.brokers.split`): connections kept for them, and
`PendingReply`, one call on its way.

The connections are redis-py's own (made from the client's pool settings, so the handshake --
AUTH, SELECT, client name -- is redis-py's), but kept apart from its pool: a split call owns
its connection from the request until the reply is whole, and reads the reply itself with a
``hiredis.Reader`` from bytes the event loop saw arrive. They are opened in broker threads,
never on the event loop (a connect can wait up to the socket timeout): a split call that
finds none idle answers None, runs whole in a thread, and asks the next script run in a thread
to open one (`LoopConnections.top_up`). Clients that cannot be read this way are never split:
a Cluster client (no single pool), TLS (bytes can wait inside the TLS layer where readiness
does not show them), RESP3, client-side caching, or no ``hiredis``.
"""

from __future__ import annotations

import logging
import select
import socket
import threading
from collections.abc import Callable, Sequence
from typing import Any, Generic, TypeVar

from taskgate import forks
from taskgate.brokers.nowait import WouldBlock
from taskgate.brokers.split import MAX_SPLIT_REQUEST
from taskgate.errors import BrokerError

hiredis: Any
try:
    import hiredis
except ImportError:  # redis-py runs without it; then nothing is split
    hiredis = None

__all__ = [
    "LOOP_CLIENT_NAME",
    "MAX_LOOP_CONNECTIONS",
    "MAX_SPLIT_REQUEST",
    "LoopConnections",
    "PendingReply",
    "pack_request",
]

log = logging.getLogger("taskgate")

T = TypeVar("T")

# Split calls in flight at once; more wait for none -- they run in threads.
MAX_LOOP_CONNECTIONS = 8
# The client name of the connections (when the client's own have none).
LOOP_CLIENT_NAME = "taskgate-loop"
_READ_SIZE = 65536
_MISSING_FUNCTION = "Function not found"


class LoopConnections:
    """Connected redis-py connections reserved for split calls, at most `MAX_LOOP_CONNECTIONS`."""

    def __init__(self, client: Any) -> None:
        self._make = _connection_maker(client)
        self._idle: list[Any] = []
        self._open = 0  # idle or in use by a split call
        self._wanted = False
        self._closed = False
        self._lock = threading.Lock()
        forks.register(self)

    @property
    def usable(self) -> bool:
        """Whether this client's calls can be split at all."""
        return self._make is not None

    def take(self) -> Any | None:
        """An idle connection for a split call, or None (asking for one more when below the cap)."""
        if self._make is None:
            return None
        with self._lock:
            connection = self._idle.pop() if self._idle else None
        if connection is not None and _readable(connection):
            # An idle connection with something to read was closed by the server (a restart,
            # its idle timeout, CLIENT KILL): dropped here, before a request is lost in it.
            self.drop(connection)
            connection = None
        if connection is None:
            with self._lock:
                self._wanted = not self._closed and self._open < MAX_LOOP_CONNECTIONS
        return connection

    def give_back(self, connection: Any) -> None:
        """A connection whose reply was read whole: idle again (closed if the broker is)."""
        with self._lock:
            if not self._closed:
                self._idle.append(connection)
                return
        self.drop(connection)

    def drop(self, connection: Any) -> None:
        """Close a connection that is broken or not needed any more."""
        with self._lock:
            self._open -= 1
        connection.disconnect()

    def top_up(self) -> None:
        """In a broker thread: open the connection a split call asked for, if any."""
        if not self._wanted or self._make is None:
            return
        with self._lock:
            if not self._wanted or self._closed or self._open >= MAX_LOOP_CONNECTIONS:
                return
            self._wanted = False
            self._open += 1
        try:
            connection = self._make()
            connection.connect()
        except Exception as exc:  # the thread's own call reports an unreachable server
            log.debug("could not open a Redis connection for event-loop calls: %s", exc)
            with self._lock:
                self._open -= 1
            return
        if not isinstance(getattr(connection, "_sock", None), socket.socket) or _is_tls(connection):
            self._make = None  # this client's sockets cannot be read from the event loop
            self.drop(connection)
            return
        self.give_back(connection)

    def close(self) -> None:
        """Close the idle connections; those in use close when their reply is read."""
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
        for connection in idle:
            self.drop(connection)

    def after_fork_in_child(self) -> None:
        """In a forked child (`taskgate.forks`): no connections. The parent's sockets
        are shared, so they are neither used nor shut down here (redis-py's own disconnect does
        not shut down a socket another process opened), and a lock some other thread held at
        the fork would never be released here."""
        self._idle, self._open, self._wanted = [], 0, False
        self._lock = threading.Lock()


class PendingReply(Generic[T]):
    """One script call whose request is sent: what its `taskgate.brokers.split.SplitCall`
    reads the reply with."""

    __slots__ = ("_answer", "_connection", "_owner", "_reader", "_reply", "_socket", "_what", "timeout")

    def __init__(
        self,
        owner: LoopConnections,
        connection: Any,
        what: str,
        answer: Callable[[list[Any]], T],
    ) -> None:
        self._owner = owner
        self._connection = connection
        self._socket: socket.socket = connection._sock
        self._what = what
        self._answer = answer
        self._reader = hiredis.Reader()
        self._reply: Any = _WAITING
        timeout = self._socket.gettimeout()
        self.timeout = float(timeout) if timeout is not None else 5.0

    def fileno(self) -> int:
        """The connection's socket."""
        return self._socket.fileno()

    def receive(self) -> bool:
        """Read what arrived and say whether the reply is whole; a broken connection raises."""
        if self._reply is not _WAITING:
            return True
        try:
            data = self._socket.recv(_READ_SIZE)
        except OSError as exc:  # socket.timeout included: the finishing thread waited too long
            self._broken(f"{type(exc).__name__}: {exc}")
        if not data:
            self._broken("ConnectionError: the server closed the connection")
        self._reader.feed(data)
        try:
            reply = self._reader.gets()
        except hiredis.ProtocolError as exc:
            self._broken(f"InvalidResponse: {exc}")
        if reply is False:
            return False
        self._reply = reply
        self._owner.give_back(self._connection)  # whole: free for the next call
        return True

    def result(self) -> T:
        """The method's answer from the reply; the script's error as `BrokerError`."""
        reply = self._reply
        if isinstance(reply, hiredis.ReplyError):
            message = str(reply).removeprefix("ERR ")
            if message == _MISSING_FUNCTION:
                raise WouldBlock(f"{self._what}: the server has not got the function library")
            raise BrokerError(f"Redis {self._what} failed: ResponseError: {message}")
        return self._answer(list(reply))

    def _broken(self, why: str) -> Any:
        self._owner.drop(self._connection)
        raise BrokerError(f"Redis {self._what} failed: {why}")


_WAITING = object()


def pack_request(connection: Any, request: Sequence[Any]) -> list[bytes]:
    """``request`` in RESP, for ``connection.send_packed_command``.

    hiredis packs the strings, bytes and numbers a script call carries in one C call. redis-py's
    own packer first walks the arguments in Python (a bytearray-or-memoryview check on each):
    a claim carrying ten acks has 80 of them. Anything else goes to redis-py's packer, which
    converts what it can and names what it cannot.
    """
    try:
        return [hiredis.pack_command(tuple(request))]
    except TypeError:
        return list(connection.pack_command(*request))


def _connection_maker(client: Any) -> Callable[[], Any] | None:
    """How to make a connection like the client's, or None when its calls cannot be split."""
    pool = getattr(client, "connection_pool", None)
    if hiredis is None or pool is None:
        return None
    connection_class = getattr(pool, "connection_class", None)
    kwargs = getattr(pool, "connection_kwargs", None)
    if connection_class is None or not isinstance(kwargs, dict):
        return None
    if getattr(pool, "cache", None) is not None or kwargs.get("protocol") not in (None, 2, "2"):
        return None
    if "ssl" in connection_class.__name__.lower():
        return None
    # Named, unless the client names its connections: CLIENT LIST then shows which they are.
    named = {**kwargs, "client_name": kwargs.get("client_name") or LOOP_CLIENT_NAME}
    return lambda: connection_class(**named)


def _is_tls(connection: Any) -> bool:
    try:
        import ssl
    except ImportError:  # pragma: no cover - Python built without ssl
        return False
    return isinstance(connection._sock, ssl.SSLSocket)


def _readable(connection: Any) -> bool:
    """Whether the socket has something to read (or was closed) now, without waiting."""
    sock = getattr(connection, "_sock", None)
    if sock is None:
        return True
    if hasattr(select, "poll"):
        poller = select.poll()
        poller.register(sock, select.POLLIN)
        return bool(poller.poll(0))
    readable, _, _ = select.select([sock], [], [], 0)
    return bool(readable)
