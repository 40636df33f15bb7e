"""The dashboard's pages (GET): the overview, the task list and a task's page."""

from __future__ import annotations

from urllib.parse import urlencode

from starlette.requests import Request
from starlette.responses import Response

from taskgate.brokers.base import check_identifier
from taskgate.dashboard import render
from taskgate.dashboard.reads import read_detail, read_overview, read_page
from taskgate.dashboard.site import Refused, Site
from taskgate.task import Filter, Status

__all__ = ["FILTER_FIELDS", "overview", "task", "tasks"]

# The task list's filters, as query parameters (all optional).
FILTER_FIELDS = ("type", "queue", "status", "group", "business_key", "parent")
DEFAULT_LIMIT = 50
MAX_LIMIT = 500


async def overview(site: Site, request: Request) -> Response:
    """Counts by type and status, and each known queue's figures."""
    data = await site.call(read_overview, site.broker, site.catalog)
    purged = request.query_params.get("purged", "")
    return site.page(
        request,
        "overview.html",
        data=data,
        statuses=list(Status),
        final=[s for s in Status if s.is_final],
        purged=int(purged) if purged.isdigit() and len(purged) < 10 else None,
        title="Overview",
    )


async def tasks(site: Site, request: Request) -> Response:
    """The tasks the query's filters select, a page at a time (``limit``, ``offset``)."""
    chosen = _chosen(request)
    query = _filter(chosen, request)
    found = await site.call(read_page, site.broker, query)
    links = {
        "prev": _page_link(chosen, query.limit, query.offset - query.limit) if query.offset > 0 else None,
        "next": _page_link(chosen, query.limit, query.offset + query.limit) if found.more else None,
    }
    return site.page(
        request,
        "tasks.html",
        page=found,
        chosen=chosen,
        query=query,
        links=links,
        statuses=list(Status),
        title="Tasks",
    )


def _chosen(request: Request) -> dict[str, str]:
    chosen = {}
    for name in FILTER_FIELDS:
        value = request.query_params.get(name, "").strip()
        if value:
            try:
                chosen[name] = check_identifier(value, what=name)
            except ValueError as exc:
                raise Refused(400, str(exc)) from None
    if "status" in chosen and chosen["status"] not in Status.__members__.values():
        raise Refused(400, f"unknown status {chosen['status']!r}; known: {', '.join(Status)}")
    return chosen


def _filter(chosen: dict[str, str], request: Request) -> Filter:
    limit = _number(request, "limit", DEFAULT_LIMIT)
    offset = _number(request, "offset", 0)
    status = Status(chosen["status"]) if "status" in chosen else None
    return Filter(
        type=chosen.get("type"),
        queue=chosen.get("queue"),
        status=status,
        business_key=chosen.get("business_key"),
        group=chosen.get("group"),
        limit=min(max(limit, 1), MAX_LIMIT),
        offset=offset,
        parent=chosen.get("parent"),
    )


def _number(request: Request, name: str, default: int) -> int:
    text = request.query_params.get(name, "").strip()
    if not text:
        return default
    if not text.isdigit() or len(text) > 9:
        raise Refused(400, f"{name} must be a whole number >= 0, got {text[:20]!r}")
    return int(text)


def _page_link(chosen: dict[str, str], limit: int, offset: int) -> str:
    return "/tasks?" + urlencode({**chosen, "limit": limit, "offset": max(0, offset)})


async def task(site: Site, request: Request) -> Response:
    """One task: payload, result, error, counters, times, parents, children, replays, progress."""
    task_id = _path_id(request)
    detail = await site.call(read_detail, site.broker, task_id)
    found = detail.task
    return site.page(
        request,
        "task.html",
        detail=detail,
        task=found,
        payload=render.show_bytes(found.payload),
        result=render.show_bytes(found.result),
        progress=render.show_json_text(found.progress_json),
        title=f"Task {found.id}",
    )


def _path_id(request: Request) -> str:
    try:
        return check_identifier(request.path_params["task_id"], what="task id")
    except ValueError as exc:
        raise Refused(400, str(exc)) from None
