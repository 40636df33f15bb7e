"""A TCP proxy between one worker and the store's server, with the faults the nemesis needs.

Threads, two per connection (one per direction). Faults:

- `cut`: close every open connection at once (a reset: both ends see it);
- `delay`: add latency to every chunk forwarded, for a while;
- `half_open`: stop forwarding one direction for a while (the bytes wait in the proxy; both
  ends think the connection is up and one of them hears nothing), then resume.
"""

from __future__ import annotations

import socket
import threading
import time

__all__ = ["Proxy"]

UP, DOWN = "up", "down"  # client -> server, server -> client


class Proxy:
    """Listens on 127.0.0.1:``port`` (a free one) and forwards to 127.0.0.1:``target``."""

    def __init__(self, target: int) -> None:
        self.target = target
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._listener.getsockname()[1]
        self._lock = threading.Lock()
        self._connections: set[socket.socket] = set()
        self._delay = 0.0
        self._delay_until = 0.0
        self._blocked: dict[str, float] = {UP: 0.0, DOWN: 0.0}
        self._closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    def cut(self) -> int:
        """Close every open connection; how many there were."""
        with self._lock:
            connections, self._connections = self._connections, set()
        for sock in connections:
            _close(sock)
        return len(connections)

    def delay(self, seconds: float, for_: float) -> None:
        """Hold each forwarded chunk ``seconds`` longer, for the next ``for_`` seconds."""
        self._delay, self._delay_until = seconds, time.monotonic() + for_

    def half_open(self, direction: str, for_: float) -> None:
        """Forward nothing in ``direction`` (`UP` or `DOWN`) for the next ``for_`` seconds."""
        self._blocked[direction] = time.monotonic() + for_

    def heal(self) -> None:
        """End every delay and half-open at once."""
        self._delay_until = 0.0
        self._blocked = {UP: 0.0, DOWN: 0.0}

    def close(self) -> None:
        """Stop listening and close every connection."""
        self._closed = True
        _close(self._listener)
        self.cut()

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            try:
                server = socket.create_connection(("127.0.0.1", self.target), timeout=5)
            except OSError:
                _close(client)  # the server is down: the client sees a refused/closed connection
                continue
            server.settimeout(None)
            for sock in (client, server):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            with self._lock:
                self._connections.update((client, server))
            threading.Thread(target=self._pump, args=(client, server, UP), daemon=True).start()
            threading.Thread(target=self._pump, args=(server, client, DOWN), daemon=True).start()

    def _pump(self, source: socket.socket, sink: socket.socket, direction: str) -> None:
        try:
            while True:
                data = source.recv(65536)
                if not data:
                    break
                now = time.monotonic()
                if now < self._delay_until:
                    time.sleep(self._delay)
                while time.monotonic() < self._blocked[direction] and not self._closed:
                    if source not in self._connections:  # cut meanwhile
                        return
                    time.sleep(0.02)
                sink.sendall(data)
        except OSError:
            pass
        finally:
            with self._lock:
                self._connections.discard(source)
                self._connections.discard(sink)
            _close(source)
            _close(sink)


def _close(sock: socket.socket) -> None:
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    sock.close()
