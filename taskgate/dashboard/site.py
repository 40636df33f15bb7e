"""`Site`: what every dashboard endpoint shares -- the broker and the queues it knows, the
thread hop for broker calls, the guard every request passes (``auth``, then for actions the
``allow_actions`` flag and the CSRF token), and rendering with the security headers.
"""

from __future__ import annotations

import functools
import inspect
import secrets
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar
from urllib.parse import parse_qs, quote

import anyio.to_thread
import jinja2
from starlette.requests import Request
from starlette.responses import HTMLResponse, PlainTextResponse, RedirectResponse, Response

from taskgate.brokers.base import Broker
from taskgate.dashboard import render
from taskgate.dashboard.csrf import FIELD, Csrf
from taskgate.dashboard.reads import Catalog
from taskgate.errors import BrokerError, TaskgateError, TaskNotFoundError

__all__ = ["AuthCheck", "Refused", "Site"]

T = TypeVar("T")

# ``auth(request)``: True lets the request in; False answers 403. It may be async, and may
# raise starlette's HTTPException itself (a 401 asking for credentials).
AuthCheck = Callable[[Request], bool | Awaitable[bool]]
Endpoint = Callable[["Site", Request], Awaitable[Response]]

# The largest action form read; a bigger body is refused unread.
MAX_FORM_BYTES = 16 * 1024
_FORM_TYPE = "application/x-www-form-urlencoded"


class Refused(Exception):
    """An action refused before anything changed: answered with ``status`` and ``reason``."""

    def __init__(self, status: int, reason: str) -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason


class Site:
    """The state one dashboard app's endpoints share; see the module docstring."""

    def __init__(
        self,
        broker: Broker,
        catalog: Catalog,
        *,
        allow_actions: bool,
        auth: AuthCheck | None,
        csrf: Csrf,
        refresh: int,
    ) -> None:
        self.broker = broker
        self.catalog = catalog
        self.allow_actions = allow_actions
        self.refresh = refresh
        self._auth = auth
        self._csrf = csrf
        self._templates = jinja2.Environment(
            loader=jinja2.PackageLoader("taskgate.dashboard", "templates"),
            autoescape=True,
            undefined=jinja2.StrictUndefined,
        )
        self._templates.filters.update(time=render.show_time, duration=render.show_timedelta, seg=_segment)

    async def call(self, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)`` in a worker thread: broker calls block, the event loop must not."""
        return await anyio.to_thread.run_sync(functools.partial(fn, *args))

    # -- guarding ------------------------------------------------------------------------------

    def guard(self, endpoint: Endpoint) -> Callable[[Request], Awaitable[Response]]:
        """``endpoint`` behind ``auth``, with refusals and store errors answered as pages."""

        async def guarded(request: Request) -> Response:
            if not await self._allowed(request):
                return PlainTextResponse("Forbidden", status_code=403, headers=_HEADERS)
            try:
                return await endpoint(self, request)
            except Refused as exc:
                return self.message(request, exc.status, exc.reason)
            except TaskNotFoundError as exc:
                return self.message(request, 404, str(exc))
            except BrokerError as exc:
                return self.message(request, 503, f"The store did not answer: {exc}")
            except TaskgateError as exc:
                return self.message(request, 409, str(exc))

        return guarded

    async def _allowed(self, request: Request) -> bool:
        if self._auth is None:
            return True
        verdict = self._auth(request)
        if inspect.isawaitable(verdict):
            verdict = await verdict
        return verdict is True

    async def action_form(self, request: Request) -> dict[str, str]:
        """The fields of an action's form, once the action is allowed: `Refused` with 403 when
        actions are off or the form carries no valid CSRF token (a body that is no form carries
        none), with 400 for a form over `MAX_FORM_BYTES`."""
        if not self.allow_actions:
            raise Refused(403, "Actions are disabled on this dashboard (allow_actions=False).")
        form = await _read_form(request)
        if not self._csrf.valid(request, form.get(FIELD)):
            raise Refused(403, "The form's CSRF token is missing or wrong: reload the page and try again.")
        return form

    # -- answering -----------------------------------------------------------------------------

    @staticmethod
    def base(request: Request) -> str:
        """The path the dashboard is mounted at ("" at the root), for links."""
        return str(request.scope.get("root_path", "")).rstrip("/")

    def redirect(self, request: Request, path: str) -> Response:
        """303 to ``path`` under the dashboard's mount point (after a POST)."""
        return RedirectResponse(self.base(request) + path, status_code=303, headers=_HEADERS)

    def page(self, request: Request, template: str, status: int = 200, **context: Any) -> Response:
        """Render ``template`` with the shared context, the CSRF cookie and security headers."""
        nonce = self._csrf.nonce(request)
        fresh = nonce is None
        if nonce is None:
            nonce = self._csrf.new_nonce()
        script_nonce = secrets.token_urlsafe(16)
        html = self._templates.get_template(template).render(
            base=self.base(request),
            allow_actions=self.allow_actions,
            csrf_token=self._csrf.token(nonce) if self.allow_actions else "",
            csrf_field=FIELD,
            nonce=script_nonce,
            refresh=self.refresh,
            **context,
        )
        headers = {**_HEADERS, "Content-Security-Policy": _csp(script_nonce)}
        response = HTMLResponse(html, status_code=status, headers=headers)
        if fresh and self.allow_actions:
            self._csrf.set_cookie(response, request, nonce, self.base(request) + "/")
        return response

    def message(self, request: Request, status: int, text: str) -> Response:
        """A page saying ``text`` with ``status``."""
        return self.page(request, "message.html", status, code=status, text=text, title=str(status))


# Payloads may hold personal data: never cached, never framed, never sniffed.
_HEADERS = {
    "Cache-Control": "no-store",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",
    "X-Frame-Options": "DENY",
}


async def _read_form(request: Request) -> dict[str, str]:
    """The fields of a urlencoded form body (the last value of a repeated one); {} for a body
    that is not such a form."""
    if request.headers.get("content-type", "").split(";")[0].strip() != _FORM_TYPE:
        return {}
    body = b""
    async for chunk in request.stream():
        body += chunk
        if len(body) > MAX_FORM_BYTES:
            raise Refused(400, "The form is too large.")
    try:
        parsed = parse_qs(body.decode("utf-8"), max_num_fields=20)
    except (UnicodeDecodeError, ValueError):  # not UTF-8, or too many fields
        return {}
    return {name: values[-1] for name, values in parsed.items()}


def _csp(nonce: str) -> str:
    # Only the page's own inline style and script run: an injected one would lack the nonce.
    return (
        f"default-src 'none'; style-src 'nonce-{nonce}'; script-src 'nonce-{nonce}'; "
        "connect-src 'self'; img-src 'self' data:; form-action 'self'; frame-ancestors 'none'; "
        "base-uri 'none'"
    )


def _segment(value: object) -> str:
    """``value`` quoted as one URL path segment (a task id or queue name)."""
    return quote(str(value), safe="")
