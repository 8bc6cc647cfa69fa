"""Remote use of the dashboard: the access token and the folders local paths may come from.

Served beyond localhost (``gnq dashboard --address 0.0.0.0``), anyone who can reach the port
could type any local path into New audit; so the dashboard then asks for a token (printed at
start, as Jupyter does) and accepts local paths only under the data roots: ``$GNQ_DATA_ROOTS``
(folders separated by ``os.pathsep``), by default the working folder (which holds data/).
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
from pathlib import Path

from gnq_core.errors import GNQError

__all__ = ["ADDRESS_ENV", "COOKIE_NAME", "GATE_ENV", "HOSTS_ENV", "LOCAL_ADDRESSES", "TOKEN_ENV",
           "OutsideRootsError", "cookie_ok", "cookie_value", "dashboard_command", "data_roots", "local_path",
           "new_token", "roots_enforced", "token_ok", "under_roots"]

TOKEN_ENV = "GNQ_DASHBOARD_TOKEN"
ROOTS_ENV = "GNQ_DATA_ROOTS"
GATE_ENV = "GNQ_HTTP_GATE"  # set in the server process by the HTTP gate (dashboard/gate.py)
COOKIE_NAME = "gnq_auth"
ADDRESS_ENV = "GNQ_DASHBOARD_ADDRESS"  # the address the dashboard listens on (the gate's Host check)
HOSTS_ENV = "GNQ_DASHBOARD_HOSTS"  # further host names it answers for, separated by commas


class OutsideRootsError(GNQError, ValueError):
    """A local path outside the configured data roots."""


def data_roots() -> list[Path]:
    """The folders local paths must lie under (resolved)."""
    value = os.environ.get(ROOTS_ENV, "")
    roots = [Path(p).expanduser() for p in value.split(os.pathsep) if p.strip()] or [Path.cwd(),
                                                                                     Path.cwd() / "data"]
    return [r.resolve() for r in roots]


def under_roots(path: str | Path) -> Path:
    """``path`` resolved (symlinks followed); refused when it leaves every data root."""
    resolved = Path(path).expanduser().resolve()
    roots = data_roots()
    if not any(resolved == r or resolved.is_relative_to(r) for r in roots):
        raise OutsideRootsError(f"{path}: outside the folders this dashboard may read and write "
                                f"({', '.join(map(str, roots))}); set {ROOTS_ENV} to allow another")
    return resolved


def new_token() -> str:
    return secrets.token_urlsafe(24)


def token_ok(given: str | None) -> bool:
    """True when no token is required, or ``given`` is it (compared in constant time)."""
    expected = os.environ.get(TOKEN_ENV)
    return not expected or (given is not None and hmac.compare_digest(given.encode(), expected.encode()))


def cookie_value(token: str) -> str:
    """What the gate's cookie holds: a digest of the token, never the token itself."""
    return hashlib.sha256(b"gnq-dashboard-cookie\0" + token.encode()).hexdigest()


def cookie_ok(given: str | None) -> bool:
    """True when a token is set and ``given`` is its cookie value (constant time)."""
    expected = os.environ.get(TOKEN_ENV)
    return bool(expected) and isinstance(given, str) and hmac.compare_digest(
        given.encode(), cookie_value(expected).encode())


def roots_enforced() -> bool:
    """Roots apply when configured, and always when the dashboard is served with a token
    (remotely); a local single-user session may open any path, as the CLI does."""
    return bool(os.environ.get(ROOTS_ENV) or os.environ.get(TOKEN_ENV))


def local_path(path: str | Path) -> Path:
    """A path typed into the dashboard: checked against the data roots when they apply."""
    return under_roots(path) if roots_enforced() else Path(path).expanduser()


LOCAL_ADDRESSES = ("127.0.0.1", "localhost", "::1")


def dashboard_command(app_file: Path, address: str, port: int, token: bool | None = None
                      ) -> tuple[list[str], dict[str, str], str | None]:
    """(argv, environment, token) that start the dashboard with streamlit.  A token is made when
    the address is not local (or when asked), and put in the environment the app and its HTTP
    gate check; a non-local address without a token is refused.  Tracebacks never reach the
    browser (``client.showErrorDetails none``)."""
    import sys

    local = address in LOCAL_ADDRESSES
    if token is False and not local:
        raise ValueError(f"--address {address} without a token would let anyone who reaches the port "
                         "read your files and start jobs; drop --no-token, or listen on 127.0.0.1")
    env = dict(os.environ)
    env[ADDRESS_ENV] = address  # the gate answers only for this host (and loopback names)
    made = new_token() if (token if token is not None else not local) else None
    if made:
        env[TOKEN_ENV] = made
    else:
        env.pop(TOKEN_ENV, None)
    argv = [sys.executable, "-m", "streamlit", "run", str(app_file), "--server.address", address,
            "--server.port", str(port), "--server.headless", "true", "--browser.gatherUsageStats", "false",
            "--client.showErrorDetails", "none"]
    return argv, env, made
