"""The dashboard's sign-in: sessions that expire and end at logout, and a throttle on wrong tokens.

A session cookie is 256 random bits; Postgres keeps only its SHA-256 with
an expiry (``CONVEYOR_ADMIN_SESSION_SECONDS``), so a cookie copied before
logout stops working the moment logout revokes it, on every API process.
Wrong tokens are counted per client address over a sliding window: past
``CONVEYOR_ADMIN_LOGIN_ATTEMPTS`` failures in ``CONVEYOR_ADMIN_LOGIN_WINDOW``
seconds, a wrong token answers 429 (and is not recorded); the right one
still signs in, so no one sharing or claiming an address locks the operator
out. The address is the peer's, or what a proxy of
``CONVEYOR_TRUSTED_PROXIES`` forwarded. A session is
bound to the admin token that opened it: rotating ``CONVEYOR_ADMIN_TOKEN``
ends every session of the old one.

The SQL is in ``sessions.sql``; the clock is the database's.
"""

from __future__ import annotations

import functools
import hashlib
import secrets
from pathlib import Path
from typing import TYPE_CHECKING

from conveyor.db import load_queries

if TYPE_CHECKING:
    from conveyor.app import App

QUERIES = load_queries(Path(__file__).with_name("sessions.sql"))


def _digest(cookie: str) -> str:
    return hashlib.sha256(cookie.encode()).hexdigest()


@functools.lru_cache(maxsize=4)
def _epoch_of(token: str) -> str:
    # Slow on purpose (computed once per token and process): the table must not make the token cheap to guess.
    return hashlib.pbkdf2_hmac("sha256", token.encode(), b"conveyor admin session epoch", 200_000).hex()[:32]


def token_epoch(app: "App") -> str | None:
    """The current admin token's epoch, or None when no token is configured."""
    secret = app.settings.admin_token
    token = secret.get_secret_value() if secret is not None else ""
    return _epoch_of(token) if token else None


def open_session(app: "App", client: str) -> str:
    """A new session for ``client``; returns the cookie value (never stored)."""
    cookie = secrets.token_urlsafe(32)
    with app.pool.connection() as conn:
        conn.execute(QUERIES["prune_sessions"])
        conn.execute(
            QUERIES["create_session"],
            {
                "digest": _digest(cookie),
                "epoch": token_epoch(app),
                "client": client[:200],
                "seconds": float(app.settings.admin_session_seconds),
            },
        )
    return cookie


def is_live(app: "App", cookie: str) -> bool:
    """Whether ``cookie`` is a session of the current admin token that has neither expired nor been revoked."""
    epoch = token_epoch(app)
    if not cookie or len(cookie) > 100 or epoch is None:
        return False
    with app.pool.connection() as conn:
        row = conn.execute(QUERIES["live_session"], {"digest": _digest(cookie), "epoch": epoch}).fetchone()
    return row is not None


def revoke(app: "App", cookie: str) -> None:
    """End a session: its cookie signs nobody in again, wherever it was copied to."""
    if cookie and len(cookie) <= 100:
        with app.pool.connection() as conn:
            conn.execute(QUERIES["revoke_session"], {"digest": _digest(cookie)})


def csrf_token(cookie: str) -> str:
    """The token a form of this session carries: derived from the HttpOnly cookie, which no other site can read."""
    return hashlib.sha256(f"conveyor csrf\x1f{cookie}".encode()).hexdigest()


def throttled(app: "App", client: str) -> bool:
    """True when ``client`` has used up its wrong guesses for the window."""
    settings = app.settings
    with app.pool.connection() as conn:
        row = conn.execute(
            QUERIES["recent_failures"], {"client": client[:200], "window": float(settings.admin_login_window)}
        ).fetchone()
    assert row is not None  # a count always returns one row
    count: int = row[0]
    return count >= settings.admin_login_attempts


def record_failure(app: "App", client: str) -> None:
    with app.pool.connection() as conn:
        conn.execute(QUERIES["prune_failures"], {"window": float(app.settings.admin_login_window)})
        conn.execute(QUERIES["record_failure"], {"client": client[:200]})
