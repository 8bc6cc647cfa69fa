"""The dashboard's HTTP gate: with a token set ($GNQ_DASHBOARD_TOKEN), no request reaches Streamlit
without it, not only the pages: the upload endpoint (``PUT /_stcore/upload_file/…``), media
downloads (``/media/…``), the websocket, static files.

The address ``gnq dashboard`` prints carries ``?token=…``; the gate answers that request with an
HttpOnly, SameSite=Strict cookie holding a digest of the token, and every later request
(websocket, uploads, downloads, a reload after the app has taken the token out of the address)
is let through on the cookie. Anything else gets 403 and one line. Only the health probe is
open. A pure ASGI middleware, so it also sees websocket handshakes.
"""

from __future__ import annotations

import os
from collections.abc import Awaitable, Callable, MutableMapping
from http.cookies import CookieError, SimpleCookie
from typing import Any
from urllib.parse import parse_qs

from gnq_core.access import COOKIE_NAME, GATE_ENV, TOKEN_ENV, cookie_ok, cookie_value, token_ok

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
ASGIApp = Callable[[Scope, Callable[[], Awaitable[Message]], Callable[[Message], Awaitable[None]]],
                   Awaitable[None]]

_OPEN_PATHS = ("/_stcore/health", "/healthz")  # say only "ok"
_REFUSAL = (b"This dashboard needs its access token: open the address `gnq dashboard` printed "
            b"(it ends in ?token=...).\n")


def _header(scope: Scope, name: bytes) -> str:
    return next((v.decode("latin-1") for k, v in scope.get("headers", []) if k.lower() == name), "")


def _cookie(scope: Scope) -> str | None:
    try:
        jar = SimpleCookie(_header(scope, b"cookie"))
    except CookieError:
        return None
    morsel = jar.get(COOKIE_NAME)
    return morsel.value if morsel else None


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
        if scope["type"] not in ("http", "websocket") or not os.environ.get(TOKEN_ENV):
            return await self.app(scope, receive, send)
        if scope["path"].endswith(_OPEN_PATHS) or cookie_ok(_cookie(scope)):
            return await self.app(scope, receive, send)
        given = _query_token(scope)
        if given is not None and token_ok(given):
            return await self.app(scope, receive, _setting_cookie(send) if scope["type"] == "http" else send)
        if scope["type"] == "websocket":  # closing before accepting answers the handshake with 403
            await send({"type": "websocket.close", "code": 1008})
            return None
        await send({"type": "http.response.start", "status": 403,
                    "headers": [(b"content-type", b"text/plain; charset=utf-8"),
                                (b"content-length", str(len(_REFUSAL)).encode()),
                                (b"cache-control", b"no-store")]})
        await send({"type": "http.response.body", "body": _REFUSAL})
        return None


def _setting_cookie(send: Callable[[Message], Awaitable[None]]) -> Callable[[Message], Awaitable[None]]:
    cookie = (f"{COOKIE_NAME}={cookie_value(os.environ[TOKEN_ENV])}; Path=/; HttpOnly; "
              "SameSite=Strict").encode()

    async def wrapped(message: Message) -> None:
        if message["type"] == "http.response.start":
            message = dict(message)
            message["headers"] = [*message.get("headers", []), (b"set-cookie", cookie)]
        await send(message)

    return wrapped
