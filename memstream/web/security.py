"""Who may use the dashboard: localhost by default; anywhere else only with the token, on every request.

The token arrives as `Authorization: Bearer T`, or once as `?token=T` in a link, which sets an HttpOnly,
SameSite=Strict cookie and redirects to the same page without it (the token stays out of the history and of
any Referer). Without a token, requests must name a loopback host in their Host header: a web page that
points its own domain at 127.0.0.1 (DNS rebinding) is refused. Forms that change anything carry a CSRF
token. Every response gets the headers that keep untrusted memory text inert (strict CSP, nosniff).
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import os
import secrets
from collections.abc import Awaitable, Callable, Mapping

from aiohttp import web

from memstream.errors import ConfigError

__all__ = ["COOKIE", "TOKEN_ENV", "Guard", "is_loopback", "resolve_token", "security_headers"]

TOKEN_ENV = "MEMSTREAM_WEB_TOKEN"
COOKIE = "memstream_token"
MIN_TOKEN = 16
CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; "
       "form-action 'self'; frame-ancestors 'none'; base-uri 'none'")
HEADERS = {"Content-Security-Policy": CSP, "X-Content-Type-Options": "nosniff", "Referrer-Policy": "no-referrer",
           "X-Frame-Options": "DENY", "Cross-Origin-Opener-Policy": "same-origin",
           "Cross-Origin-Resource-Policy": "same-origin"}
PUBLIC = frozenset({"/favicon.ico"})  # what a browser fetches for any page, even a refusal: holds nothing
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def is_loopback(host: str) -> bool:
    """Whether a host name or address is this machine only (localhost, 127.0.0.0/8, ::1)."""
    name = host.strip().strip("[]").lower()
    if name == "localhost" or name.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def resolve_token(host: str, token: str | None, environ: Mapping[str, str] | None = None) -> str | None:
    """The token to require (from --token or $MEMSTREAM_WEB_TOKEN); a ConfigError when binding beyond this
    machine without one, or with one too short to guess-proof."""
    env = os.environ if environ is None else environ
    token = token if token is not None else env.get(TOKEN_ENV) or None
    if token is not None and len(token) < MIN_TOKEN:
        raise ConfigError(f"the web token must be at least {MIN_TOKEN} characters (make one with: "
                          "python -c 'import secrets; print(secrets.token_urlsafe())')")
    if token is None and not is_loopback(host):
        raise ConfigError(f"--host {host} lets other machines in: give a token with --token or ${TOKEN_ENV} "
                          f"(at least {MIN_TOKEN} characters), or keep the default --host 127.0.0.1")
    return token


class Guard:
    """The request checks of one dashboard: host, token (when set) and CSRF."""

    def __init__(self, token: str | None) -> None:
        self.token = token
        self._secret = secrets.token_bytes(32)
        self.csrf = hmac.new(self._secret, b"csrf", hashlib.sha256).hexdigest()
        # The cookie holds a digest of the token, never the token.
        self._cookie = None if token is None else hmac.new(token.encode(), b"cookie", hashlib.sha256).hexdigest()

    @web.middleware
    async def middleware(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        """Refuse a foreign Host (no token) or a missing token; trade a ?token= link for the cookie."""
        if self.token is None:
            if not is_loopback(request.url.host or ""):
                raise web.HTTPForbidden(text="this dashboard answers only to localhost, 127.0.0.1 or [::1]\n")
            return await handler(request)
        if request.path in PUBLIC or self._bearer_ok(request) or _same(request.cookies.get(COOKIE, ""), self._cookie):
            return await handler(request)
        given = request.query.get("token")
        if given is not None and request.method == "GET" and _same(given, self.token):
            rest = [(k, v) for k, v in request.rel_url.query.items() if k != "token"]
            response = web.Response(status=303, headers={"Location": str(request.rel_url.with_query(rest))})
            response.set_cookie(COOKIE, self._cookie or "", httponly=True, samesite="Strict", path="/",
                                secure=request.secure)
            return response
        raise web.HTTPUnauthorized(text="a token is required: open the dashboard once as /?token=TOKEN, "
                                        "or send Authorization: Bearer TOKEN\n",
                                   headers={"WWW-Authenticate": 'Bearer realm="memstream"'})

    def _bearer_ok(self, request: web.Request) -> bool:
        scheme, _, value = request.headers.get("Authorization", "").partition(" ")
        return scheme.lower() == "bearer" and _same(value.strip(), self.token)

    async def check_form(self, request: web.Request) -> None:
        """A state-changing request: the form's CSRF token, and an Origin (when sent) of this very site."""
        origin = request.headers.get("Origin")
        if origin is not None and origin != f"{request.scheme}://{request.host}":
            raise web.HTTPForbidden(text="cross-site request refused\n")
        form = await request.post()
        if not _same(str(form.get("csrf", "")), self.csrf):
            raise web.HTTPForbidden(text="missing or stale form token: reload the page and try again\n")


def _same(given: str, expected: str | None) -> bool:
    """A constant-time comparison of a secret with what a request sent (any text)."""
    return expected is not None and hmac.compare_digest(given.encode("utf-8", "surrogatepass"), expected.encode())


async def security_headers(request: web.Request, response: web.StreamResponse) -> None:
    """on_response_prepare: the headers every response carries (errors and static files too)."""
    response.headers.update(HEADERS)
    if not request.path.startswith("/static/"):
        response.headers["Cache-Control"] = "no-store"
