"""Who may use ``/admin`` and ``/api/admin``: whoever holds ``CONVEYOR_ADMIN_TOKEN``.

Callers present it as ``Authorization: Bearer <token>``. The dashboard,
which a browser opens, takes it once in a login form and then carries a
session cookie derived from it (an HMAC of the token, never the token
itself; HttpOnly, SameSite=Strict). A request that changes something
with only the cookie must also carry ``X-Requested-With: conveyor``,
which no other site can make a browser send.

With no token configured every admin route answers 403: closed, never
open. Comparisons run in constant time.
"""

from __future__ import annotations

import enum
import hashlib
import hmac

from fastapi import HTTPException, Request

#: The dashboard's session cookie.
COOKIE = "conveyor_admin"

#: Header a cookie-authenticated change must carry (the dashboard's script sends it).
CSRF_HEADER = "X-Requested-With"
CSRF_VALUE = "conveyor"

_SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})


class Access(enum.Enum):
    GRANTED = "granted"
    CLOSED = "closed"  # no admin token is configured
    DENIED = "denied"  # no credentials, or wrong ones


def _digest(value: str) -> bytes:
    # Hashing both sides first keeps the comparison constant-time in the length too.
    return hashlib.sha256(value.encode()).digest()


def same_secret(given: str, expected: str) -> bool:
    """Constant-time comparison of two secrets."""
    return hmac.compare_digest(_digest(given), _digest(expected))


def session_value(token: str) -> str:
    """The dashboard cookie for ``token``: proves the token was given without being it."""
    return hmac.new(token.encode(), b"conveyor dashboard session v1", hashlib.sha256).hexdigest()


def configured_token(request: Request) -> str | None:
    secret = request.app.state.conveyor.settings.admin_token
    value = secret.get_secret_value() if secret is not None else ""
    return value or None


def check_access(request: Request) -> Access:
    """Whether this request may use the admin routes."""
    token = configured_token(request)
    if token is None:
        return Access.CLOSED
    header = request.headers.get("authorization", "")
    scheme, _, credentials = header.partition(" ")
    if scheme.lower() == "bearer" and credentials:
        return Access.GRANTED if same_secret(credentials.strip(), token) else Access.DENIED
    cookie = request.cookies.get(COOKIE)
    if cookie and same_secret(cookie, session_value(token)):
        if request.method in _SAFE_METHODS or request.headers.get(CSRF_HEADER) == CSRF_VALUE:
            return Access.GRANTED
    return Access.DENIED


def require_admin(request: Request) -> None:
    """FastAPI dependency of every JSON admin route: 403 when closed, 401 without the right token."""
    access = check_access(request)
    if access is Access.CLOSED:
        raise HTTPException(403, "admin routes are closed: CONVEYOR_ADMIN_TOKEN is not set")
    if access is Access.DENIED:
        raise HTTPException(401, "a valid admin token is required (Authorization: Bearer <token>)",
                            headers={"WWW-Authenticate": "Bearer"})
