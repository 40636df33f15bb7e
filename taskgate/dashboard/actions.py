"""The dashboard's actions (POST forms): cancel and replay a task, pause and resume a queue.

Each passes `Site.action_form` first (``allow_actions``, the CSRF token; ``auth`` already
passed), then makes one change through the broker in a worker thread and redirects (303) to
the page showing its effect. A refused action changes nothing.
"""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response

from taskgate.brokers.base import Broker, check_identifier
from taskgate.brokers.params import Hold, Replay
from taskgate.dashboard.site import Refused, Site
from taskgate.durations import parse_duration
from taskgate.ids import new_id
from taskgate.runtime.recovery import descendants_to_rerun, replay_pairs
from taskgate.task import Filter, Task

__all__ = ["cancel", "pause", "replay", "resume"]


async def cancel(site: Site, request: Request) -> Response:
    """Cancel the task (a running one is marked; its worker stops it)."""
    await site.action_form(request)
    task_id = _path_value(request, "task_id")
    await site.call(site.broker.cancel, task_id)
    return site.redirect(request, f"/tasks/{task_id}")


async def replay(site: Site, request: Request) -> Response:
    """Re-run the final task as a new execution (with ``descendants=1`` its canceled
    descendants too; ``allow_completed=1`` for a completed one); shows the new one."""
    form = await site.action_form(request)
    task_id = _path_value(request, "task_id")
    pairs: tuple[tuple[str, str], ...] = ()
    if form.get("descendants") == "1":

        async def list_tasks(query: Filter) -> list[Task]:
            return await site.call(site.broker.list, query)

        pairs = replay_pairs(await descendants_to_rerun(list_tasks, task_id))
    order = Replay(task_id, new_id(), allow_completed=form.get("allow_completed") == "1", descendants=pairs)
    made = await site.call(_replay, site.broker, order)
    return site.redirect(request, f"/tasks/{made.id}")


def _replay(broker: Broker, order: Replay) -> Task:
    return broker.replay(order)


async def pause(site: Site, request: Request) -> Response:
    """Hold the queue for the form's ``for`` (a duration such as "10m"; empty: until resumed)."""
    form = await site.action_form(request)
    queue = _path_value(request, "queue")
    text = form.get("for", "").strip()
    try:
        wait = parse_duration(text, field="for") if text else None
        hold = Hold(queue, for_=wait)
    except (TypeError, ValueError) as exc:
        raise Refused(400, str(exc)) from None
    await site.call(site.broker.hold, hold)
    return site.redirect(request, "/")


async def resume(site: Site, request: Request) -> Response:
    """End the queue's hold, whatever set it."""
    await site.action_form(request)
    queue = _path_value(request, "queue")
    await site.call(site.broker.hold, Hold(queue, resume=True))
    return site.redirect(request, "/")


def _path_value(request: Request, name: str) -> str:
    try:
        return check_identifier(request.path_params[name], what=name)
    except ValueError as exc:
        raise Refused(400, str(exc)) from None
