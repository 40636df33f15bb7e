"""A plain WSGI web app -- what Flask and Django views run on -- queueing work with taskgate.

The web process has no event loop and runs no workers: it uses `taskgate.SyncClient`. An order
and the task that ships it are written in ONE database transaction (`enqueue_in`): a request
that fails after the order was added rolls both back, and no task ships an order that does
not exist. A separate worker process runs the ``ship`` handler.

Run it (two terminals, one SQLite file)::

    python examples/wsgi_shop.py serve  --url sqlite:///shop.db --port 8000
    python examples/wsgi_shop.py worker --url sqlite:///shop.db
    curl -X POST 'localhost:8000/orders?item=lamp'      # {"order": 1, "task": "01J..."}
    curl localhost:8000/tasks/01J...                   # {"status": "completed", ...}
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable, Iterable, Sequence
from typing import Any
from urllib.parse import parse_qs
from wsgiref.simple_server import make_server

import anyio
from sqlalchemy import String, create_engine
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

from taskgate import Config, Gate, QueueConfig, SyncClient, Task, TaskNotFoundError
from taskgate.brokers import SQLBroker

StartResponse = Callable[[str, list[tuple[str, str]]], Any]


class Base(DeclarativeBase):
    pass


class Order(Base):
    __tablename__ = "orders"
    id: Mapped[int] = mapped_column(primary_key=True)
    item: Mapped[str] = mapped_column(String(100))
    shipped: Mapped[bool] = mapped_column(default=False)


def config(url: str) -> Config:
    """The same configuration in the web process and in the workers."""
    return Config(
        broker=SQLBroker(url), queues={"shipping": QueueConfig(workers=2)}, routes={"ship": "shipping"}
    )


def make_app(url: str) -> tuple[Callable[[dict[str, Any], StartResponse], Iterable[bytes]], SyncClient]:
    """The WSGI app over the database at ``url``, and its client (close it when done)."""
    engine = create_engine(url)
    Base.metadata.create_all(engine)
    client = SyncClient(config(url))
    # Its first call makes taskgate's tables (if missing) now, not inside a request's transaction
    # (on SQLite that would wait for the request's own write lock).
    client.overview()

    def place_order(query: dict[str, list[str]]) -> tuple[str, dict[str, Any]]:
        item = query.get("item", [""])[0]
        with Session(engine) as session, session.begin():  # commits both, or neither
            order = Order(item=item)
            session.add(order)
            session.flush()
            task_id = client.enqueue_in(session, "ship", {"order": order.id})
            if not item:
                raise ValueError("item is required")  # rolls back the order AND its task
            return "201 Created", {"order": order.id, "task": task_id}

    def app(environ: dict[str, Any], start_response: StartResponse) -> Iterable[bytes]:
        method, path = environ["REQUEST_METHOD"], environ.get("PATH_INFO", "/")
        try:
            if method == "POST" and path == "/orders":
                status, body = place_order(parse_qs(environ.get("QUERY_STRING", "")))
            elif method == "GET" and path.startswith("/tasks/"):
                task = client.get(path.removeprefix("/tasks/"))
                status, body = "200 OK", {"status": task.status.value, "result": task.result_json()}
            else:
                status, body = "404 Not Found", {"error": "no such page"}
        except (ValueError, TaskNotFoundError) as exc:
            status, body = "400 Bad Request", {"error": str(exc)}
        start_response(status, [("Content-Type", "application/json")])
        return [json.dumps(body).encode()]

    return app, client


def make_worker(url: str) -> Gate:
    """The worker process's gate: it ships orders."""
    engine = create_engine(url)
    gate = Gate(config(url))

    @gate.handler("ship")
    def ship(task: Task) -> str:  # a plain def: runs in a worker thread
        with Session(engine) as session, session.begin():
            order = session.get_one(Order, task.json()["order"])
            order.shipped = True
            return f"shipped {order.item}"

    return gate


async def run_worker(url: str) -> None:
    """Run the workers until interrupted."""
    async with make_worker(url):
        await anyio.sleep_forever()


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("role", choices=["serve", "worker"])
    parser.add_argument("--url", default="sqlite:///shop.db")
    parser.add_argument("--port", type=int, default=8000)
    args = parser.parse_args(argv)
    if args.role == "worker":
        anyio.run(run_worker, args.url)
        return
    app, client = make_app(args.url)
    with client, make_server("127.0.0.1", args.port, app) as server:  # type: ignore[arg-type]
        server.serve_forever()


if __name__ == "__main__":
    main()
