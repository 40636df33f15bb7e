"""`app`: the dashboard as an ASGI app over a broker, mountable anywhere."""

from __future__ import annotations

from collections.abc import Mapping

from starlette.applications import Starlette
from starlette.routing import Route

from taskgate.brokers.base import Broker
from taskgate.config import Config, QueueConfig
from taskgate.dashboard import actions, pages
from taskgate.dashboard.csrf import Csrf
from taskgate.dashboard.reads import catalog_of
from taskgate.dashboard.site import AuthCheck, Site

__all__ = ["app"]


def app(
    broker: Broker,
    *,
    allow_actions: bool = False,
    auth: AuthCheck | None = None,
    queues: Config | Mapping[str, QueueConfig] | None = None,
    secret: bytes | None = None,
    refresh: int = 5,
) -> Starlette:
    """The dashboard over ``broker``, an ASGI app: serve it, or mount it
    (``fastapi_app.mount("/tasks", app(broker))``); its links follow the mount point.

    Read-only unless ``allow_actions=True``, which adds cancel, replay (with descendants),
    pause, resume and purge as POST forms carrying a CSRF token. ``auth(request)`` (a plain or
    async function taking the Starlette `Request`) is asked on EVERY request, pages included,
    since payloads may hold personal data: True lets it in, anything else answers 403 (it may
    raise starlette's ``HTTPException(401, headers={"WWW-Authenticate": ...})`` to ask for credentials).
    ``queues`` (a `Config`, or a mapping of queue name to `QueueConfig`) names the queues the
    overview shows and their limits and quota budgets; without it the overview shows the task
    counts only. ``secret`` signs the CSRF tokens (at least 16 bytes; None: random per app, so
    with several server processes give them one). ``refresh``: seconds between the pages'
    refreshes when enabled (1 to 3600).
    """
    if not isinstance(allow_actions, bool):
        raise TypeError(f"allow_actions must be a bool, got {allow_actions!r}")
    if auth is not None and not callable(auth):
        raise TypeError(f"auth must be callable or None, got {auth!r}")
    if isinstance(refresh, bool) or not isinstance(refresh, int) or not 1 <= refresh <= 3600:
        raise ValueError(f"refresh must be a whole number of seconds from 1 to 3600, got {refresh!r}")
    site = Site(
        broker,
        catalog_of(queues),
        allow_actions=allow_actions,
        auth=auth,
        csrf=Csrf(secret),
        refresh=refresh,
    )
    routes = [
        Route("/", site.guard(pages.overview), methods=["GET"], name="overview"),
        Route("/tasks", site.guard(pages.tasks), methods=["GET"], name="tasks"),
        Route("/tasks/{task_id}", site.guard(pages.task), methods=["GET"], name="task"),
        Route("/tasks/{task_id}/cancel", site.guard(actions.cancel), methods=["POST"], name="cancel"),
        Route("/tasks/{task_id}/replay", site.guard(actions.replay), methods=["POST"], name="replay"),
        Route("/queues/{queue}/pause", site.guard(actions.pause), methods=["POST"], name="pause"),
        Route("/queues/{queue}/resume", site.guard(actions.resume), methods=["POST"], name="resume"),
        Route("/purge", site.guard(actions.purge), methods=["POST"], name="purge"),
    ]
    return Starlette(routes=routes)
