"""The dashboard's actions (POST forms): cancel and replay a task, pause and resume a queue,
purge final tasks.

Each passes `Site.action_form` first (``allow_actions``, the CSRF token; ``auth`` already
passed), then makes one change through the broker in a worker thread and redirects (303) to
the page showing its effect. A refused action changes nothing.
"""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response

from taskgate.brokers.base import Broker, check_identifier
from taskgate.brokers.params import Hold, Prune, Replay
from taskgate.dashboard.site import Refused, Site
from taskgate.durations import parse_duration
from taskgate.ids import new_id
from taskgate.runtime.purge import purge_params
from taskgate.runtime.recovery import descendants_to_rerun, replay_pairs
from taskgate.task import Filter, Status, Task

__all__ = ["cancel", "pause", "purge", "replay", "resume"]


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


async def purge(site: Site, request: Request) -> Response:
    """Delete the final tasks the form selects (``status``: one final status or any; ``queue``,
    ``type``, ``group``; ``older_than``: finished at least that long ago, e.g. "7d"), as
    `Gate.purge` does; the overview then says how many went."""
    form = await site.action_form(request)
    try:
        status = Status(form["status"]) if form.get("status") else None
        chosen = {name: form.get(name) or None for name in ("queue", "type", "group")}
        query = Filter(status=status, queue=chosen["queue"], type=chosen["type"], group=chosen["group"])
        prune, _ = purge_params(query, form.get("older_than", "").strip() or None)
    except (TypeError, ValueError) as exc:
        raise Refused(400, str(exc)) from None
    went = await site.call(_purge, site.broker, prune)
    return site.redirect(request, f"/?purged={went}")


def _purge(broker: Broker, prune: Prune) -> int:
    # Bounded prunes until one deletes nothing (see `taskgate.runtime.purge`), in one thread hop.
    deleted = 0
    while went := broker.prune(prune):
        deleted += went
    return deleted


def _path_value(request: Request, name: str) -> str:
    try:
        return check_identifier(request.path_params[name], what=name)
    except ValueError as exc:
        raise Refused(400, str(exc)) from None
