"""The gate matches exact paths and checks every request's Host and Origin:
``/anything/healthz`` is not the health probe, a host name the dashboard does not serve is refused
with or without a token (DNS rebinding), and a websocket must come from the dashboard's own origin,
same port.  The ASGI middleware is driven directly, so no server is started."""

from __future__ import annotations

import asyncio

import pytest

from gnq_core.access import ADDRESS_ENV, HOSTS_ENV, TOKEN_ENV, cookie_value, dashboard_command
from gnq_core.dashboard.gate import TokenGate

TOKEN = "s3cret-token"
HOST = "127.0.0.1:8501"


def _call(path: str = "/", *, kind: str = "http", method: str = "GET", host: str | None = HOST,
          origin: str | None = None, cookie: str | None = None) -> int:
    """The status the gate gives: 200 when it lets the request through to the app."""
    headers = [(b"host", host.encode())] if host is not None else []
    if origin is not None:
        headers.append((b"origin", origin.encode()))
    if cookie is not None:
        headers.append((b"cookie", cookie.encode()))
    scope = {"type": kind, "path": path, "method": method, "headers": headers, "query_string": b""}
    sent: list[dict] = []

    async def app(scope, receive, send) -> None:
        sent.append({"type": "passed"})

    async def receive() -> dict:
        return {"type": "http.request", "body": b""}

    async def send(message) -> None:
        sent.append(message)

    asyncio.run(TokenGate(app)(scope, receive, send))
    first = sent[0]
    if first["type"] == "passed":
        return 200
    return 403 if first["type"] == "websocket.close" else first["status"]


@pytest.fixture
def token(monkeypatch):
    monkeypatch.setenv(TOKEN_ENV, TOKEN)
    monkeypatch.setenv(ADDRESS_ENV, "127.0.0.1")
    monkeypatch.delenv(HOSTS_ENV, raising=False)


@pytest.fixture
def no_token(monkeypatch):
    monkeypatch.delenv(TOKEN_ENV, raising=False)
    monkeypatch.setenv(ADDRESS_ENV, "127.0.0.1")
    monkeypatch.delenv(HOSTS_ENV, raising=False)


def test_only_the_exact_health_paths_are_open(token):
    assert _call("/healthz") == 200 and _call("/_stcore/health") == 200
    assert _call("/anything/healthz") == 403  # served the app page without the token before
    assert _call("/_stcore/upload_file/some-session/healthz", method="PUT") == 403
    assert _call("/healthz/") == 403 and _call("/x/_stcore/health") == 403
    assert _call("/", cookie=f"gnq_auth={cookie_value(TOKEN)}") == 200


@pytest.mark.parametrize("host", ["evil.example:8501", "evil.example", "127.0.0.1.evil.example:8501",
                                  "user@127.0.0.1:8501", "127.0.0.1:port", ""])
def test_a_host_the_dashboard_does_not_serve_is_refused_on_every_request(no_token, token_or_not, host):
    assert _call("/", host=host) == 403
    assert _call("/healthz", host=host) == 403
    assert _call("/_stcore/stream", kind="websocket", host=host, origin=f"http://{host}") == 403


@pytest.fixture(params=[False, True], ids=["no-token", "token"])
def token_or_not(request, monkeypatch):
    if request.param:
        monkeypatch.setenv(TOKEN_ENV, TOKEN)


def test_a_request_without_host_is_refused(no_token):
    assert _call("/", host=None) == 403


@pytest.mark.parametrize("host", [HOST, "localhost:8501", "[::1]:8501", "LOCALHOST:8501", "127.0.0.1"])
def test_loopback_hosts_are_served(no_token, host):
    assert _call("/", host=host) == 200


def test_the_websocket_origin_must_be_the_dashboards_own(no_token):
    ws = {"kind": "websocket", "host": HOST}
    assert _call("/_stcore/stream", origin=f"http://{HOST}", **ws) == 200
    assert _call("/_stcore/stream", origin="http://127.0.0.1:9999", **ws) == 403  # another local port
    assert _call("/_stcore/stream", origin="http://localhost:8501", **ws) == 403  # another host name
    assert _call("/_stcore/stream", origin="http://evil.example", **ws) == 403
    assert _call("/_stcore/stream", origin="null", **ws) == 403
    assert _call("/_stcore/stream", **ws) == 403  # a browser always sends one
    # an upload from a page on another port (same site for cookies) is refused too
    assert _call("/_stcore/upload_file/s/f", method="PUT", origin="http://127.0.0.1:9999") == 403
    assert _call("/_stcore/upload_file/s/f", method="PUT", origin=f"http://{HOST}") == 200


def test_a_wildcard_address_serves_any_host_unless_hosts_are_listed(monkeypatch):
    monkeypatch.setenv(TOKEN_ENV, TOKEN)
    monkeypatch.setenv(ADDRESS_ENV, "0.0.0.0")
    monkeypatch.delenv(HOSTS_ENV, raising=False)
    cookie = f"gnq_auth={cookie_value(TOKEN)}"
    assert _call("/", host="gpu-box.lan:8501", cookie=cookie) == 200
    monkeypatch.setenv(HOSTS_ENV, "gpu-box.lan")
    assert _call("/", host="gpu-box.lan:8501", cookie=cookie) == 200
    assert _call("/", host="other.lan:8501", cookie=cookie) == 403
    monkeypatch.setenv(ADDRESS_ENV, "10.0.0.5")
    monkeypatch.delenv(HOSTS_ENV)
    assert _call("/", host="10.0.0.5:8501", cookie=cookie) == 200
    assert _call("/", host="other.lan:8501", cookie=cookie) == 403


def test_the_dashboard_tells_the_gate_its_address():
    from hostile_helpers import ROOT

    _, env, _ = dashboard_command(ROOT / "gnq_core" / "dashboard" / "server.py", "0.0.0.0", 8600, token=True)
    assert env[ADDRESS_ENV] == "0.0.0.0"
