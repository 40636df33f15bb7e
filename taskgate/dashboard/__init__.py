"""The web dashboard (extra ``taskgate[dashboard]``): `app` makes an ASGI app over a broker.

Server-rendered with Jinja2 (autoescaped) on Starlette; no build step, no JavaScript needed
(a small inline script refreshes the page when enabled). Read-only unless
``allow_actions=True``; every broker call runs in a worker thread.

Layout: `factory` builds the app, `site` guards every request (auth, headers) and renders,
`reads` gathers what a page shows, `pages` and `actions` are the endpoints, `csrf` signs the
forms' tokens, `render` turns stored bytes into text for the templates.
"""

from __future__ import annotations

from taskgate.errors import ConfigError

try:
    import jinja2  # noqa: F401
    import starlette  # noqa: F401
except ImportError as exc:  # the extra is not installed: say which one to install
    raise ConfigError(
        f"taskgate.dashboard needs Starlette and Jinja2, which cannot be imported ({exc}): "
        "pip install 'taskgate[dashboard]'"
    ) from exc

from taskgate.dashboard.factory import app

__all__ = ["app"]
