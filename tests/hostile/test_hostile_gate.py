"""Nothing reachable before the token: the real server on 127.0.0.1 refuses an
anonymous client's uploads, media downloads, websocket and pages at the HTTP layer; the token
leaves the address once given; tracebacks never reach the browser; a non-local address without a
token is refused."""

from __future__ import annotations

import http.client
import socket
import subprocess
import time
import tomllib
from collections.abc import Iterator

import pytest
from hostile_helpers import ROOT
from streamlit.testing.v1 import AppTest
from typer.testing import CliRunner

from gnq_core.access import COOKIE_NAME, GATE_ENV, cookie_value, dashboard_command
from gnq_core.cli import app

TOKEN = "s3cret-token"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _request(port: int, method: str, path: str, body: bytes | None = None,
             headers: dict[str, str] | None = None) -> http.client.HTTPResponse:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=20)
    conn.request(method, path, body=body, headers=headers or {})
    response = conn.getresponse()
    response.body = response.read()  # type: ignore[attr-defined]
    conn.close()
    return response


def _websocket_status(port: int, cookie: str | None = None) -> int:
    """The status line's code of a websocket handshake to Streamlit's stream (101 = opened)."""
    lines = ["GET /_stcore/stream HTTP/1.1", f"Host: 127.0.0.1:{port}", "Upgrade: websocket",
             "Connection: Upgrade", "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==",
             "Sec-WebSocket-Version: 13", f"Origin: http://127.0.0.1:{port}"]
    if cookie:
        lines.append(f"Cookie: {cookie}")
    with socket.create_connection(("127.0.0.1", port), timeout=20) as s:
        s.sendall(("\r\n".join(lines) + "\r\n\r\n").encode())
        return int(s.recv(4096).split(b" ", 2)[1])


@pytest.fixture(scope="module")
def server(tmp_path_factory) -> Iterator[int]:
    """`gnq dashboard --token` as it is started (same argv and environment), on a free port."""
    port = _free_port()
    argv, env, token = dashboard_command(ROOT / "gnq_core" / "dashboard" / "server.py",
                                         "127.0.0.1", port, token=True)
    env["GNQ_DASHBOARD_TOKEN"] = TOKEN
    env["GNQ_DB"] = str(tmp_path_factory.mktemp("gate") / "gnq.duckdb")
    proc = subprocess.Popen(argv, env=env, cwd=tmp_path_factory.getbasetemp(), stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 90
        while True:
            try:
                if _request(port, "GET", "/_stcore/health").status == 200:
                    break
            except OSError:
                pass
            assert proc.poll() is None and time.monotonic() < deadline, "the dashboard did not start"
            time.sleep(0.3)
        yield port
    finally:
        proc.terminate()
        proc.wait(timeout=30)


@pytest.mark.slow
def test_an_anonymous_client_can_neither_upload_nor_download(server):
    port = server
    upload = _request(port, "PUT", "/_stcore/upload_file/some-session/some-file", body=b"x" * 100_000,
                      headers={"Content-Type": "application/octet-stream"})
    assert upload.status == 403 and b"access token" in upload.body  # the gate's refusal
    assert _request(port, "GET", "/media/0123456789abcdef.csv").status == 403
    assert _request(port, "GET", "/").status == 403
    assert _request(port, "GET", "/?token=wrong").status == 403
    assert _request(port, "GET", "/", headers={"Cookie": f"{COOKIE_NAME}=forged"}).status == 403
    assert _websocket_status(port) == 403  # no session at all, so no session id to upload to


@pytest.mark.slow
def test_the_token_opens_everything_by_cookie(server):
    port = server
    page = _request(port, "GET", f"/?token={TOKEN}")
    assert page.status == 200
    cookie = page.getheader("set-cookie")
    assert cookie and "HttpOnly" in cookie and "SameSite=Strict" in cookie and TOKEN not in cookie
    jar = cookie.split(";")[0]
    assert jar == f"{COOKIE_NAME}={cookie_value(TOKEN)}"
    assert _request(port, "GET", "/", headers={"Cookie": jar}).status == 200  # a reload, token gone
    assert _websocket_status(port, jar) == 101
    # past the gate: Streamlit's own answer (its XSRF check, an unknown session), not the gate's
    upload = _request(port, "PUT", "/_stcore/upload_file/some-session/some-file", body=b"x",
                      headers={"Cookie": jar})
    assert b"access token" not in upload.body


def test_a_non_local_address_without_a_token_is_refused():
    with pytest.raises(ValueError, match="without a token"):
        dashboard_command(ROOT / "gnq_core" / "dashboard" / "server.py", "0.0.0.0", 8600, token=False)
    result = CliRunner().invoke(app, ["dashboard", "--address", "0.0.0.0", "--no-token", "--port", "1"])
    assert result.exit_code == 1 and result.output.count("\n") == 1 and "without a token" in result.output


def test_tracebacks_never_reach_the_browser():
    argv, _, _ = dashboard_command(ROOT / "gnq_core" / "dashboard" / "server.py", "127.0.0.1", 8600)
    assert argv[argv.index("--client.showErrorDetails") + 1] == "none"
    assert argv[argv.index("run") + 1].endswith("server.py")  # the gated app, not main.py bare
    config = tomllib.loads((ROOT / "gnq_core" / "dashboard" / ".streamlit" / "config.toml").read_text())
    assert config["client"]["showErrorDetails"] == "none"


def test_the_token_leaves_the_address_once_given(monkeypatch, tmp_path):
    monkeypatch.setenv("GNQ_DASHBOARD_TOKEN", TOKEN)
    monkeypatch.setenv(GATE_ENV, "1")
    monkeypatch.setenv("GNQ_DB", str(tmp_path / "gnq.duckdb"))
    at = AppTest.from_file(str(ROOT / "app" / "main.py"), default_timeout=120)
    at.query_params["token"] = TOKEN
    at.run()
    assert not at.exception and not any("access token" in e.value for e in at.error)
    assert "token" not in at.query_params  # a shared address does not carry it


def test_a_token_without_the_gate_is_refused(monkeypatch, tmp_path):
    """`streamlit run app/main.py` with a token set would leave uploads and media open."""
    monkeypatch.setenv("GNQ_DASHBOARD_TOKEN", TOKEN)
    monkeypatch.delenv(GATE_ENV, raising=False)
    monkeypatch.setenv("GNQ_DB", str(tmp_path / "gnq.duckdb"))
    at = AppTest.from_file(str(ROOT / "app" / "main.py"), default_timeout=120)
    at.query_params["token"] = TOKEN
    at.run()
    assert any("HTTP gate" in e.value for e in at.error)
