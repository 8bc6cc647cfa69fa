"""The dashboard's HTTP gate: with a token set ($GNQ_DASHBOARD_TOKEN), no request reaches Streamlit
without it, not only the pages: the upload endpoint (``PUT /_stcore/upload_file/…``), media
downloads (``/media/…``), the websocket, static files.

The address ``gnq dashboard`` prints carries ``?token=…``; the gate answers that request with an
HttpOnly, SameSite=Strict cookie holding a digest of the token, and every later request
(websocket, uploads, downloads, a reload after the app has taken the token out of the address)
is let through on the cookie. Anything else gets 403 and one line. Only the health probe is
open, at its exact paths (``/anything/healthz`` is not it). A pure ASGI middleware, so it also sees
websocket handshakes.

With or without a token, every request must name a host this dashboard serves (``Host``: a
loopback name, the address it listens on, or one of ``$GNQ_DASHBOARD_HOSTS``; any name when it
listens on every interface and that variable is unset), which stops DNS rebinding; and a request
that carries an ``Origin`` (the websocket must) must come from the dashboard's own origin, same
host and port, so a page served from another local port cannot drive it.
"""

from __future__ import annotations

import os
from collections.abc import Awaitable, Callable, MutableMapping
from http.cookies import CookieError, SimpleCookie
from typing import Any
from urllib.parse import parse_qs, urlsplit

from gnq_core.access import (
    ADDRESS_ENV,
    COOKIE_NAME,
    GATE_ENV,
    HOSTS_ENV,
    LOCAL_ADDRESSES,
    TOKEN_ENV,
    cookie_ok,
    cookie_value,
    token_ok,
)

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
ASGIApp = Callable[[Scope, Callable[[], Awaitable[Message]], Callable[[Message], Awaitable[None]]],
                   Awaitable[None]]

_OPEN_PATHS = frozenset({"/_stcore/health", "/healthz"})  # say only "ok"; matched exactly
_WILDCARDS = ("0.0.0.0", "::", "")  # listening on every interface
_REFUSAL = (b"This dashboard needs its access token: open the address `gnq dashboard` printed "
            b"(it ends in ?token=...).\n")
_WRONG_HOST = b"This dashboard does not answer for this host name or origin.\n"


def _header(scope: Scope, name: bytes) -> str:
    return next((v.decode("latin-1") for k, v in scope.get("headers", []) if k.lower() == name), "")


def _cookie(scope: Scope) -> str | None:
    try:
        jar = SimpleCookie(_header(scope, b"cookie"))
    except CookieError:
        return None
    morsel = jar.get(COOKIE_NAME)
    return morsel.value if morsel else None


def _hostname(netloc: str) -> str | None:
    """The host name of a ``host[:port]`` (brackets of an IPv6 address removed), lower case; None
    when it is not one."""
    try:
        parts = urlsplit(f"//{netloc}")
        _ = parts.port  # a port that is not a number raises
    except ValueError:
        return None
    return parts.hostname if netloc and parts.hostname and not parts.username else None


def served_hosts() -> set[str] | None:
    """The host names requests may name; None: any (listening on every interface, no list set)."""
    listed = {h.strip().lower().strip("[]") for h in os.environ.get(HOSTS_ENV, "").split(",") if h.strip()}
    address = os.environ.get(ADDRESS_ENV, "127.0.0.1").strip().lower().strip("[]")
    if address in _WILDCARDS and not listed:
        return None
    return {*LOCAL_ADDRESSES, *listed} | ({address} if address not in _WILDCARDS else set())


def host_ok(scope: Scope) -> bool:
    """The request's Host names a host this dashboard serves, and its Origin, when it has one (a
    websocket must), is the dashboard's own: http(s)://<the same host:port>."""
    host = _header(scope, b"host").strip().lower()
    name = _hostname(host)
    hosts = served_hosts()
    if name is None or (hosts is not None and name not in hosts):
        return False
    origin = _header(scope, b"origin").strip().lower()
    if not origin:
        return scope["type"] != "websocket"
    parts = urlsplit(origin)
    return parts.scheme in ("http", "https") and parts.netloc == host and parts.path in ("", "/")


def _query_token(scope: Scope) -> str | None:
    values = parse_qs(scope.get("query_string", b"").decode("latin-1")).get("token")
    return values[-1] if values else None


class TokenGate:
    """ASGI middleware: requests without the token (query) or its cookie are refused."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        os.environ[GATE_ENV] = "1"  # the app script checks it runs behind the gate

    async def __call__(self, scope: Scope, receive: Callable[[], Awaitable[Message]],
                       send: Callable[[Message], Awaitable[None]]) -> None:
        if scope["type"] not in ("http", "websocket"):
            return await self.app(scope, receive, send)
        if not host_ok(scope):  # every request, token or not: DNS rebinding, another local page
            return await _refuse(scope, send, _WRONG_HOST)
        if not os.environ.get(TOKEN_ENV):
            return await self.app(scope, receive, send)
        if scope["path"] in _OPEN_PATHS or cookie_ok(_cookie(scope)):
            return await self.app(scope, receive, send)
        given = _query_token(scope)
        if given is not None and token_ok(given):
            return await self.app(scope, receive, _setting_cookie(send) if scope["type"] == "http" else send)
        return await _refuse(scope, send, _REFUSAL)


async def _refuse(scope: Scope, send: Callable[[Message], Awaitable[None]], body: bytes) -> None:
    """403 with one line; a websocket handshake is closed before it is accepted (also a 403)."""
    if scope["type"] == "websocket":
        await send({"type": "websocket.close", "code": 1008})
        return
    await send({"type": "http.response.start", "status": 403,
                "headers": [(b"content-type", b"text/plain; charset=utf-8"),
                            (b"content-length", str(len(body)).encode()),
                            (b"cache-control", b"no-store")]})
    await send({"type": "http.response.body", "body": body})


def _setting_cookie(send: Callable[[Message], Awaitable[None]]) -> Callable[[Message], Awaitable[None]]:
    cookie = (f"{COOKIE_NAME}={cookie_value(os.environ[TOKEN_ENV])}; Path=/; HttpOnly; "
              "SameSite=Strict").encode()

    async def wrapped(message: Message) -> None:
        if message["type"] == "http.response.start":
            message = dict(message)
            message["headers"] = [*message.get("headers", []), (b"set-cookie", cookie)]
        await send(message)

    return wrapped
