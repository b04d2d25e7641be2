"""What every request and response of the API goes through, before any route.

:class:`Guard` is pure ASGI, outermost of conveyor's middleware:

- a request that carries a body must carry credentials first: a live user
  key, the admin token or a live dashboard session, checked before one byte
  of the body is read (401 otherwise); only the dashboard's sign-in and
  sign-out forms take a body from anyone (:data:`ANONYMOUS_BODY_PATHS`).
  So no anonymous request makes the API hold more than a small body;
- a body is capped by what it is and where it goes, whether it declares its
  length or streams it (413 above): a multipart body on the upload route at
  the upload's cap (counted as it streams, never buffered here); a JSON body
  on a route that takes a long text (a resource's) at
  ``CONVEYOR_API_MAX_BODY_BYTES``; every other body at
  ``CONVEYOR_API_MAX_JSON_BYTES``;
- a NUL character in the path, the query or a JSON body answers 400
  (Postgres refuses NUL in text, which used to surface as a 500), as does a
  JSON body nested deeper than ``CONVEYOR_API_MAX_JSON_DEPTH`` or holding
  more than ``CONVEYOR_API_MAX_JSON_ITEMS`` values: judged on the bytes by
  :func:`conveyor.jsonchecks.scan_json_bytes`, never parsed here, off the
  event loop when the body is not small;
- every response carries the security headers (:data:`SECURITY_HEADERS`,
  a Content Security Policy that allows only this origin's scripts);
- an exception no route handled is logged with a fresh error id (its text
  scrubbed of every secret setting) and answered ``500 {"detail", "error_id"}``:
  no traceback or error text ever reaches the client.

Bad input is answered in one shape: ``{"detail": [{"loc": [...], "msg": ...}]}``,
the field and the problem, never the value that was sent.
"""

from __future__ import annotations

import json
import traceback
import uuid
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote_to_bytes

import anyio.to_thread
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from conveyor.api.auth import authenticated
from conveyor.api.errors import detail_for, status_for
from conveyor.errors import ConveyorError
from conveyor.jsonchecks import scan_json_bytes
from conveyor.logs import log_event
from conveyor.redaction import scrub, settings_secrets

if TYPE_CHECKING:
    from conveyor.app import App

#: A JSON body as this module builds it.
Body = dict[str, Any]
#: How the Guard answers a request itself: status, body, extra headers.
Answer = Callable[[int, Body, Sequence[tuple[bytes, bytes]]], Awaitable[None]]

#: Headers every response carries.
SECURITY_HEADERS = {
    "content-security-policy": "default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; "
    "img-src 'self' data:; object-src 'none'; base-uri 'none'; form-action 'self'; "
    "frame-ancestors 'none'",
    "x-frame-options": "DENY",
    "x-content-type-options": "nosniff",
    "referrer-policy": "no-referrer",
}

#: The only routes that read a body from a caller with no credentials: the dashboard's sign-in form (which
#: is how credentials are got) and its sign-out form (an expired session must still be able to leave).
ANONYMOUS_BODY_PATHS = frozenset({"/admin/login", "/admin/logout"})
BODY_NEEDS_CREDENTIALS = "a request with a body needs a valid API key or admin token (Authorization: Bearer ...)"
WWW_AUTHENTICATE = (b"www-authenticate", b"Bearer")


def problem(loc: list[Any], msg: str) -> Body:
    """The body of a 4xx about one field."""
    return {"detail": [{"loc": loc, "msg": msg}]}


def _json_response(status: int, body: Body, extra: Sequence[tuple[bytes, bytes]] = ()) -> tuple[Message, Message]:
    data = json.dumps(body, separators=(",", ":")).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode()), *extra]
    return (
        {"type": "http.response.start", "status": status, "headers": headers},
        {"type": "http.response.body", "body": data},
    )


def check_json(body: bytes, max_depth: int, max_items: int) -> Body | None:
    """The 400 body for a JSON body with NULs, too deep or too many values, else None (malformed JSON is the
    route's to refuse)."""
    problem_text = scan_json_bytes(body, max_depth, max_items)
    return None if problem_text is None else problem(["body"], problem_text)


#: Bodies up to this size are scanned in the event loop (well under a millisecond); larger ones in a thread.
INLINE_SCAN_BYTES = 64 * 1024

#: Media types whose body is a form, not JSON; every other body (none named included: FastAPI parses
#: that as JSON) is checked as JSON.
FORM_TYPES = (b"multipart/form-data", b"application/x-www-form-urlencoded")


class Guard:
    """The ASGI middleware described in the module docstring."""

    def __init__(
        self,
        app: ASGIApp,
        *,
        conveyor: App,
        body_limits: dict[str, int],
        long_text_prefixes: tuple[str, ...] = (),
    ) -> None:
        self.app = app
        self.conveyor = conveyor
        #: Upload routes: {path: cap of a multipart body}; any other body there has the JSON cap.
        self.body_limits = body_limits
        #: Path prefixes of routes whose JSON body may be a long text (CONVEYOR_API_MAX_BODY_BYTES).
        self.long_text_prefixes = long_text_prefixes

    def _limit(self, path: str, content_type: bytes) -> int:
        settings = self.conveyor.settings
        if content_type == b"multipart/form-data" and path in self.body_limits:
            return self.body_limits[path]
        if content_type not in FORM_TYPES and path.startswith(self.long_text_prefixes):
            return max(settings.api_max_body_bytes, settings.api_max_json_bytes)
        return settings.api_max_json_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        settings = self.conveyor.settings
        started = False
        path = scope.get("path", "")
        secure = [(name.encode(), value.encode()) for name, value in SECURITY_HEADERS.items()]

        async def send_secured(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
                names = {name.lower() for name, _ in message.get("headers", [])}
                message = {
                    **message,
                    "headers": [*message.get("headers", []), *((n, v) for n, v in secure if n not in names)],
                }
            await send(message)

        async def answer(status: int, body: Body, extra: Sequence[tuple[bytes, bytes]] = ()) -> None:
            start, data = _json_response(status, body, extra)
            await send_secured(start)
            await send_secured(data)

        refusal = self._check_target(scope)
        if refusal is not None:
            await answer(400, refusal)
            return
        headers = dict(scope.get("headers") or [])
        content_type = headers.get(b"content-type", b"").split(b";")[0].strip().lower()
        limit = self._limit(path, content_type)
        declared = headers.get(b"content-length")
        if declared is not None and (not declared.isdigit() or int(declared) > limit):
            await answer(413, problem(["body"], f"larger than {limit} bytes"))
            return
        has_body = (declared is not None and declared != b"0") or b"transfer-encoding" in headers

        async def admitted() -> Receive | None:
            """The body's receive once it may reach the route, else None (refused: answered here)."""
            if has_body and path not in ANONYMOUS_BODY_PATHS and not await authenticated(scope, self.conveyor):
                await answer(401, problem(["header", "authorization"], BODY_NEEDS_CREDENTIALS), [WWW_AUTHENTICATE])
                return None
            if not has_body or content_type in FORM_TYPES:
                return _capped(receive, limit)
            body, too_large = await self._read(receive, limit)
            if too_large:
                await answer(413, problem(["body"], f"larger than {limit} bytes"))
                return None
            max_depth, max_items = settings.api_max_json_depth, settings.api_max_json_items
            if len(body) <= INLINE_SCAN_BYTES:
                refusal = check_json(body, max_depth, max_items)
            else:
                refusal = await anyio.to_thread.run_sync(check_json, body, max_depth, max_items)
            if refusal is not None:
                await answer(400, refusal)
                return None
            return _replay(body, receive)

        try:
            body_receive = await admitted()  # the credential check may find the database away: 503 below
            if body_receive is not None:
                await self.app(scope, body_receive, send_secured)
        except _BodyTooLarge:
            if not started:
                await answer(413, problem(["body"], f"larger than {limit} bytes"))
        except ConveyorError as exc:
            if status_for(exc) == 500:
                await self._fail(exc, scope, answer, started)
            elif not started:
                await answer(status_for(exc), {"detail": detail_for(exc)})
        except Exception as exc:
            await self._fail(exc, scope, answer, started)

    async def _fail(self, exc: BaseException, scope: Scope, answer: Answer, started: bool) -> None:
        """Log an error no route handled under a fresh id; the client gets the id only (500)."""
        error_id = uuid.uuid4().hex[:16]
        secrets = settings_secrets(*self.conveyor.all_settings)
        log_event(
            "api_error",
            level="error",
            queue=None,
            job=None,
            job_id=None,
            attempt=None,
            error_id=error_id,
            method=scope.get("method"),
            route=scope.get("path", "")[:200],
            error=(scrub(f"{type(exc).__name__}: {exc}", secrets) or "")[:2000],
            trace=(scrub("".join(traceback.format_exception(exc)), secrets) or "")[-8000:],
        )
        if not started:
            await answer(
                500, {"detail": "internal error; the server's log has it under this error_id", "error_id": error_id}, ()
            )

    @staticmethod
    def _check_target(scope: Scope) -> Body | None:
        raw_path = scope.get("raw_path") or scope.get("path", "").encode("utf-8", "surrogateescape")
        if b"\x00" in raw_path or b"\x00" in unquote_to_bytes(raw_path) or "\x00" in scope.get("path", ""):
            return problem(["path"], "NUL characters are not allowed")
        query = scope.get("query_string") or b""
        if b"\x00" in unquote_to_bytes(query.replace(b"+", b" ")):
            return problem(["query"], "NUL characters are not allowed")
        return None

    @staticmethod
    async def _read(receive: Receive, limit: int) -> tuple[bytes, bool]:
        chunks, size = [], 0
        while True:
            message = await receive()
            if message["type"] != "http.request":
                break
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > limit:
                return b"", True
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        return b"".join(chunks), False


class _BodyTooLarge(Exception):
    """Raised into the route by :func:`_capped` when a streamed body passes the limit."""


def _replay(body: bytes, receive: Receive) -> Receive:
    sent = False

    async def replay() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay


def _capped(receive: Receive, limit: int) -> Receive:
    size = 0

    async def capped() -> Message:
        nonlocal size
        message = await receive()
        if message["type"] == "http.request":
            size += len(message.get("body", b""))
            if size > limit:
                raise _BodyTooLarge()
        return message

    return capped
