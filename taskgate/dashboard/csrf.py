"""CSRF tokens for the dashboard's forms: a random nonce in a cookie, and its HMAC under the
app's secret in the form's hidden ``csrf_token`` field (double submit, signed).

A cross-site page can neither read the cookie nor compute the HMAC without the secret, and the
cookie is ``SameSite=Strict`` besides. Nothing secret travels in a URL.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets

from starlette.requests import Request
from starlette.responses import Response

__all__ = ["COOKIE", "FIELD", "Csrf"]

COOKIE = "taskgate_csrf"
FIELD = "csrf_token"
_NONCE_CHARS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_")


class Csrf:
    """Makes and checks the tokens of one dashboard app, signed with ``secret`` (random per
    app when None: then a token is valid only in the process that made it)."""

    def __init__(self, secret: bytes | None = None) -> None:
        if secret is not None and (not isinstance(secret, bytes) or len(secret) < 16):
            raise ValueError("the dashboard's secret must be bytes, at least 16 of them")
        self._secret = secret if secret is not None else secrets.token_bytes(32)

    def nonce(self, request: Request) -> str | None:
        """The well-formed nonce the request's cookie carries, or None."""
        value = request.cookies.get(COOKIE, "")
        return value if 32 <= len(value) <= 64 and set(value) <= _NONCE_CHARS else None

    @staticmethod
    def new_nonce() -> str:
        """A fresh random nonce for the cookie."""
        return secrets.token_urlsafe(32)

    def token(self, nonce: str) -> str:
        """The form token that goes with ``nonce``."""
        return hmac.new(self._secret, nonce.encode("ascii"), hashlib.sha256).hexdigest()

    def valid(self, request: Request, submitted: str | None) -> bool:
        """Whether ``submitted`` (the form's field) is the token of the request's cookie."""
        nonce = self.nonce(request)
        if nonce is None or not submitted:
            return False
        return hmac.compare_digest(submitted.encode("utf-8", "replace"), self.token(nonce).encode("ascii"))

    @staticmethod
    def set_cookie(response: Response, request: Request, nonce: str, path: str) -> None:
        """Send ``nonce`` as the cookie, scoped to the dashboard's ``path``."""
        response.set_cookie(
            COOKIE,
            nonce,
            path=path or "/",
            httponly=True,
            samesite="strict",
            secure=request.url.scheme == "https",
        )
