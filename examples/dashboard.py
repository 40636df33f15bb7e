"""The dashboard over the example pipeline's store, mounted at /tasks of a host app.

    python3 -m pip install -e '.[dashboard]'
    python3 examples/llm_pipeline.py            # fills llm_pipeline.db
    python3 examples/dashboard.py               # then open http://127.0.0.1:8000/tasks/

A FastAPI app mounts it the same way: ``app.mount("/tasks", dashboard.app(broker))``.
"""

from __future__ import annotations

import argparse
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager

from starlette.applications import Starlette
from starlette.responses import RedirectResponse
from starlette.routing import Mount, Route

from taskgate import QueueConfig, dashboard
from taskgate.brokers import open_broker

# The example pipeline's queues, so the overview shows their limits.
QUEUES = {"cpu": QueueConfig(workers=4), "llm": QueueConfig(workers=2, rps=3)}


def make_app(url: str, *, allow_actions: bool = False) -> Starlette:
    """A host app serving the dashboard over the store at ``url`` under /tasks."""
    broker = open_broker(url)

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        yield
        broker.close()

    site = dashboard.app(broker, queues=QUEUES, allow_actions=allow_actions)
    return Starlette(
        routes=[Route("/", lambda request: RedirectResponse("/tasks/")), Mount("/tasks", app=site)],
        lifespan=lifespan,
    )


def main(argv: Sequence[str] | None = None) -> None:
    """Parse arguments and serve the dashboard until interrupted."""
    import uvicorn

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--broker", default="sqlite:///llm_pipeline.db", help="the store's URL")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--allow-actions", action="store_true", help="cancel, replay, pause, resume, purge")
    args = parser.parse_args(argv)
    uvicorn.run(make_app(args.broker, allow_actions=args.allow_actions), host=args.host, port=args.port)


if __name__ == "__main__":
    main()
