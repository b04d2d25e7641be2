"""What every request and response of the API goes through, before any route.

:class:`Guard` is pure ASGI, outermost of conveyor's middleware:

- a request body larger than ``CONVEYOR_API_MAX_BODY_BYTES`` answers 413,
  whether it declares its length or streams it (a multipart upload is
  counted as it streams and never buffered here);
- a NUL character in the path, the query or a JSON body answers 400
  (Postgres refuses NUL in text, which used to surface as a 500), and a
  JSON body nested deeper than ``CONVEYOR_API_MAX_JSON_DEPTH`` answers 400;
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
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote_to_bytes

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from conveyor.jsonchecks import holds_nul, json_depth_exceeds
from conveyor.logs import log_event
from conveyor.redaction import scrub, settings_secrets

if TYPE_CHECKING:
    from conveyor.app import App

#: A JSON body as this module builds it.
Body = dict[str, Any]

#: Headers every response carries.
SECURITY_HEADERS = {
    "content-security-policy": "default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; "
    "img-src 'self' data:; object-src 'none'; base-uri 'none'; form-action 'self'; "
    "frame-ancestors 'none'",
    "x-frame-options": "DENY",
    "x-content-type-options": "nosniff",
    "referrer-policy": "no-referrer",
}


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


def check_json(body: bytes, max_depth: int) -> Body | None:
    """The 400 body for a JSON body with NULs or too deep, else None (malformed JSON is the route's to refuse)."""
    lowered = body.lower()
    deep_possible = body.count(b"[") + body.count(b"{") > max_depth
    nul_possible = b"\\u0000" in lowered or b"\x00" in body
    if not (deep_possible or nul_possible):
        return None  # the common case: nothing to parse here
    try:
        value = json.loads(body)
    except RecursionError:
        return problem(["body"], f"nested deeper than {max_depth} levels")
    except ValueError:
        if b"\x00" in body:
            return problem(["body"], "NUL characters are not allowed")
        return None
    if deep_possible and json_depth_exceeds(value, max_depth):
        return problem(["body"], f"nested deeper than {max_depth} levels")
    if nul_possible and holds_nul(value):
        return problem(["body"], "NUL characters are not allowed")
    return None


class Guard:
    """The ASGI middleware described in the module docstring."""

    def __init__(self, app: ASGIApp, *, conveyor: App, body_limits: dict[str, int]) -> None:
        self.app = app
        self.conveyor = conveyor
        #: Paths allowed a body larger than the setting (an upload route sets its own cap here).
        self.body_limits = body_limits

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
        limit = self.body_limits.get(path, settings.api_max_body_bytes)
        headers = dict(scope.get("headers") or [])
        declared = headers.get(b"content-length")
        if declared is not None and (not declared.isdigit() or int(declared) > limit):
            await answer(413, problem(["body"], f"larger than {limit} bytes"))
            return
        content_type = headers.get(b"content-type", b"").split(b";")[0].strip().lower()
        if content_type == b"application/json" or content_type.endswith(b"+json"):
            body, too_large = await self._read(receive, limit)
            if too_large:
                await answer(413, problem(["body"], f"larger than {limit} bytes"))
                return
            refusal = check_json(body, settings.api_max_json_depth)
            if refusal is not None:
                await answer(400, refusal)
                return
            receive = _replay(body, receive)
        else:
            receive = _capped(receive, limit)
        try:
            await self.app(scope, receive, send_secured)
        except _BodyTooLarge:
            if not started:
                await answer(413, problem(["body"], f"larger than {limit} bytes"))
        except Exception as exc:
            error_id = uuid.uuid4().hex[:16]
            secrets = settings_secrets(settings)
            log_event(
                "api_error",
                level="error",
                queue=None,
                job=None,
                job_id=None,
                attempt=None,
                error_id=error_id,
                method=scope.get("method"),
                route=path[:200],
                error=(scrub(f"{type(exc).__name__}: {exc}", secrets) or "")[:2000],
                trace=(scrub("".join(traceback.format_exception(exc)), secrets) or "")[-8000:],
            )
            if not started:
                await answer(
                    500, {"detail": "internal error; the server's log has it under this error_id", "error_id": error_id}
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
