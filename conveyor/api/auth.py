"""Who may call what.

Producer routes (``/api/tasks``, ``/api/runs``, ``/api/resources``,
``/api/builds``) need a user's API key, ``Authorization: Bearer cvk_...``
(:func:`require_user`), and read and write only that user's records. Keys
are made with ``conveyor keys create USER`` and kept hashed
(:mod:`conveyor.access`).

``/admin``, ``/api/admin`` and ``/api/schedules`` need ``CONVEYOR_ADMIN_TOKEN``,
which is no user's key and no key is it.

Callers present it as ``Authorization: Bearer <token>``. The dashboard,
which a browser opens, takes it once in a login form and then carries a
session cookie: a random value whose session lives in Postgres
(:mod:`conveyor.api.sessions`), expires, and ends at logout (HttpOnly,
SameSite=Strict). A request that changes something
with only the cookie must also carry ``X-Requested-With: conveyor``,
which no other site can make a browser send.

With no token configured every admin route answers 403: closed, never
open. Comparisons run in constant time.
"""

from __future__ import annotations

import enum
import hashlib
import hmac
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated

from fastapi import Depends, HTTPException, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from conveyor import access
from conveyor.api import sessions

if TYPE_CHECKING:
    from starlette.types import Scope

    from conveyor.app import App

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
    if cookie and sessions.is_live(request.app.state.conveyor, cookie):
        if request.method in _SAFE_METHODS or request.headers.get(CSRF_HEADER) == CSRF_VALUE:
            return Access.GRANTED
    return Access.DENIED


def require_admin(request: Request, _: AdminToken) -> None:
    """FastAPI dependency of every JSON admin route: 403 when closed, 401 without the right token."""
    access = check_access(request)
    if access is Access.CLOSED:
        raise HTTPException(403, "admin routes are closed: CONVEYOR_ADMIN_TOKEN is not set")
    if access is Access.DENIED:
        raise HTTPException(
            401,
            "a valid admin token is required (Authorization: Bearer <token>)",
            headers={"WWW-Authenticate": "Bearer"},
        )


# -- producer routes: a user's API key -------------------------------------------

#: The producer routes' security scheme in the OpenAPI document.
user_key_scheme = HTTPBearer(
    scheme_name="userKey",
    auto_error=False,
    description="A user's API key (`conveyor keys create USER`): cvk_<id>_<secret>.",
)

#: The admin routes' security scheme in the OpenAPI document.
admin_token_scheme = HTTPBearer(
    scheme_name="adminToken",
    auto_error=False,
    description="CONVEYOR_ADMIN_TOKEN (the dashboard signs in with it once).",
)


@dataclass(frozen=True)
class Caller:
    """Who is calling a producer route: a user (by API key), or the operator (admin token) where allowed."""

    user_id: str | None
    admin: bool = False


_NEED_KEY = "a valid API key is required (Authorization: Bearer <key>; `conveyor keys create USER`)"


def _bearer(request: Request) -> str | None:
    scheme, _, credentials = request.headers.get("authorization", "").partition(" ")
    credentials = credentials.strip()
    return credentials if scheme.lower() == "bearer" and credentials else None


#: Where a request's scope keeps the user its key was found to belong to (the Guard looks before the body is
#: read, the route's dependency takes it from there instead of asking the database again).
_USER_SCOPE_KEY = "conveyor.user_id"


async def _user_of(request: Request) -> str | None:
    if _USER_SCOPE_KEY in request.scope:
        found: str | None = request.scope[_USER_SCOPE_KEY]
        return found
    key = _bearer(request)
    if key is None or not key.startswith(access.KEY_PREFIX + "_") or len(key) > 200:
        return None
    app = request.app.state.conveyor

    def look_up() -> str | None:
        with app.pool.connection() as conn:
            return access.key_user(conn, key)

    user_id = await run_in_threadpool(look_up)
    request.scope[_USER_SCOPE_KEY] = user_id
    return user_id


async def authenticated(scope: Scope, app: App) -> bool:
    """Whether a request carries any live credential: a user's key, the admin token, a dashboard session.

    The Guard asks before it reads a body, so a caller with none never makes the API hold one. Which
    routes each credential opens is still the routes' own dependencies' to say.
    """
    request = Request(scope)
    given = _bearer(request)
    if given is not None:
        token = app.settings.admin_token
        if token is not None and token.get_secret_value() and same_secret(given, token.get_secret_value()):
            return True
        return await _user_of(request) is not None
    cookie = request.cookies.get(COOKIE)
    return cookie is not None and await run_in_threadpool(sessions.is_live, app, cookie)


def _unauthorized() -> HTTPException:
    return HTTPException(401, _NEED_KEY, headers={"WWW-Authenticate": "Bearer"})


UserKey = Annotated[HTTPAuthorizationCredentials | None, Depends(user_key_scheme)]
AdminToken = Annotated[HTTPAuthorizationCredentials | None, Depends(admin_token_scheme)]


async def require_user(request: Request, _: UserKey) -> str:
    """FastAPI dependency of every producer route: the user whose live API key this is, else 401."""
    user_id = await _user_of(request)
    if user_id is None:
        raise _unauthorized()
    return user_id


async def require_user_or_admin(request: Request, _: UserKey, __: AdminToken) -> Caller:
    """A user's key (their own records only) or the admin token (everyone's), else 401."""
    user_id = await _user_of(request)
    if user_id is not None:
        return Caller(user_id)
    token = configured_token(request)
    given = _bearer(request)
    if token is not None and given is not None and same_secret(given, token):
        return Caller(None, admin=True)
    raise _unauthorized()


#: A producer route's parameter: the calling user's id (:func:`require_user`).
UserId = Annotated[str, Depends(require_user)]
#: A route's parameter that also admits the admin token (:func:`require_user_or_admin`).
UserOrAdmin = Annotated[Caller, Depends(require_user_or_admin)]
