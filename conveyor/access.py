"""Users and API keys: the library's access layer, below the agent platform.

A key names its user; the API's auth (:mod:`conveyor.api.auth`) and the
``conveyor users`` commands go through here. Only a key's digest is stored.
The tables are created by migration ``0050_access.sql``; the SQL is in
``access.sql``. Nothing here imports the platform (``conveyor.platform.records``).
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from psycopg import Connection

from conveyor.db import load_queries
from conveyor.errors import RecordNotFound

QUERIES = load_queries(Path(__file__).with_name("access.sql"))

#: A user's id: what tasks and resources carry as ``user_id`` (no dots or slashes).
USER_ID = re.compile(r"^[A-Za-z0-9_:@-]{1,128}$")

#: Every API key starts with this, so a leaked one is recognisable (secret scanners, logs).
KEY_PREFIX = "cvk"


@dataclass(frozen=True)
class ApiKey:
    """A key as it is listed: never the key itself, which is shown once at creation."""

    id: str
    user_id: str
    created_at: datetime
    revoked_at: datetime | None


def key_digest(key: str) -> str:
    """What is stored of a key. SHA-256 is enough: the key holds 256 random bits, nothing to brute-force."""
    return hashlib.sha256(key.encode()).hexdigest()


def create_user(conn: Connection[Any], user_id: str) -> bool:
    """Create a user; False when it exists already."""
    if not USER_ID.match(user_id):
        raise ValueError("a user id is 1-128 letters, digits, '_', ':', '@' or '-'")
    return conn.execute(QUERIES["create_user"], {"id": user_id}).fetchone() is not None


def user_exists(conn: Connection[Any], user_id: str) -> bool:
    return conn.execute(QUERIES["get_user"], {"id": user_id}).fetchone() is not None


def create_api_key(conn: Connection[Any], user_id: str) -> tuple[str, str]:
    """A new key of ``user_id``: (key id, key). The key is not stored, only its digest."""
    if not user_exists(conn, user_id):
        raise RecordNotFound(f"no user {user_id!r}")
    key_id = secrets.token_hex(6)
    key = f"{KEY_PREFIX}_{key_id}_{secrets.token_urlsafe(32)}"
    conn.execute(QUERIES["create_api_key"], {"id": key_id, "user_id": user_id, "digest": key_digest(key)})
    return key_id, key


def revoke_api_key(conn: Connection[Any], key_id: str) -> str:
    """Revoke a key by its id (again: no change); returns its user. :class:`RecordNotFound` if there is none."""
    row = conn.execute(QUERIES["revoke_api_key"], {"id": key_id}).fetchone()
    if row is None:
        raise RecordNotFound(f"no API key {key_id!r}")
    user_id: str = row[0]
    return user_id


def api_keys(conn: Connection[Any], user_id: str) -> list[ApiKey]:
    return [ApiKey(*row) for row in conn.execute(QUERIES["list_api_keys"], {"user_id": user_id})]


def key_user(conn: Connection[Any], key: str) -> str | None:
    """The user a live key belongs to, or None (unknown, revoked, malformed or wrong)."""
    prefix, _, rest = key.partition("_")
    key_id, _, secret = rest.partition("_")
    if prefix != KEY_PREFIX or not secret or not re.fullmatch(r"[0-9a-f]{12}", key_id):
        return None
    row = conn.execute(QUERIES["api_key_digest"], {"id": key_id}).fetchone()
    if row is None:
        return None
    user_id: str
    digest: str
    user_id, digest = row
    return user_id if hmac.compare_digest(digest, key_digest(key)) else None
