"""/api/builds: request an agent or connector build (202) and read its outcome (a user's key or the admin token).

A build request names a ``kind`` (upload, update, rollback, standalone_build,
github_clone, mcp_upload) and its fields, plus ``env``: variables whose
values are encrypted before the job is enqueued. No response ever contains
an env value, and a bad request is answered with field names only (FastAPI's
default 422 would echo the input, secrets included, so the body is
validated here instead).

Sources come over HTTP as uploads only: ``POST /api/agents/upload-and-deploy``
streams a zip to disk (never whole in memory, 413 past
``CONVEYOR_UPLOAD_MAX_BYTES`` with nothing kept) and enqueues its build;
``update`` and ``mcp_upload`` take the ``upload_id`` it answers. A request
naming a host path (``archive_path``, ``source_dir``, a local repository)
is refused here: that is for operators' own code, under configured roots.

A user's API key builds only that user's own agents and connectors (the
build's ``owner_id`` is the key's user) and reads only that user's builds;
the admin token may build and read any. The upload route is no exception.
Agent and connector ids are each user's own (:func:`scoped_target_id`): two
users may both have an ``a1``, and no answer tells one whether the other
has. That a target is the build owner's is checked in the build's own
transaction (``store.create_build``), never before it: a target of another
owner (an admin's request naming raw ids) answers 404, as a missing one.
"""

from __future__ import annotations

import json
import re
from typing import TYPE_CHECKING, Any

from fastapi import APIRouter, Body, Depends, HTTPException, Request, status
from python_multipart.exceptions import MultipartParseError
from python_multipart.multipart import MultipartParser, parse_options_header
from starlette.concurrency import run_in_threadpool
from starlette.requests import ClientDisconnect

from conveyor.api.auth import UserOrAdmin, require_admin
from conveyor.api.deps import ConveyorApp, NamePath
from conveyor.api.errors import UNAVAILABLE_RESPONSES, not_found
from conveyor.errors import ConveyorError
from conveyor.platform import records
from conveyor.platform.builds import store
from conveyor.platform.builds.requests import request_build
from conveyor.platform.builds.uploads import Uploads, UploadWriter
from conveyor.platform.errors import UploadRefused
from conveyor.platform.settings import platform_settings

if TYPE_CHECKING:
    from python_multipart.multipart import MultipartCallbacks

    from conveyor.app import App

# A user's key asks for builds of that user's own agents and connectors and reads only that user's
# builds (owner_id); another user's answer 404 as missing ones. The admin token: any.
router = APIRouter(
    prefix="/api",
    tags=["builds"],
    responses={401: {"description": "no valid API key or admin token"}, **UNAVAILABLE_RESPONSES},
)

#: The upload route: its body may be CONVEYOR_UPLOAD_MAX_BYTES + FORM_OVERHEAD, more than other routes'.
UPLOAD_PATH = "/api/agents/upload-and-deploy"
#: Bytes a multipart body may hold beyond its file: boundaries, headers and the small fields.
FORM_OVERHEAD = 256 * 1024


def body_limits(app: App) -> dict[str, int]:
    """The upload route's body cap, larger than other routes': :func:`conveyor.api.app.create_app` asks for it."""
    return {UPLOAD_PATH: platform_settings(app).upload_max_bytes + FORM_OVERHEAD}


#: The upload form's text fields; anything else is refused (listing these, not echoing the stranger).
UPLOAD_FIELDS = ("agent_id", "owner_id", "kind", "version", "changelog", "env")


@router.post(
    "/builds",
    status_code=status.HTTP_202_ACCEPTED,
    responses={
        413: {"description": "the request (env and fields) is larger than a job's payload may be"},
        422: {"description": "not a build request: the fields and what is wrong with each"},
    },
)
def create_build(
    app: ConveyorApp,
    caller: UserOrAdmin,
    body: Any = Body(..., description="{kind, ...the variant's fields, env: {NAME: value}}"),
) -> dict[str, Any]:
    if not isinstance(body, dict) or not isinstance(body.get("kind"), str):
        raise HTTPException(422, "the body is a JSON object with a 'kind'")
    fields = dict(body)
    kind, env, build_id = fields.pop("kind"), fields.pop("env", None) or {}, fields.pop("build_id", None)
    if not isinstance(env, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in env.items()):
        raise HTTPException(422, "env maps variable names to string values")
    if caller.user_id is not None:
        _own(app, fields, caller.user_id)
        if isinstance(build_id, str):  # one user's client-chosen id tells another nothing
            build_id = records.scoped_id("build", caller.user_id, build_id)
    ticket = request_build(app, kind, fields, env=env, build_id=build_id)  # errors: conveyor.api.errors' table
    return {
        "build_id": ticket.build_id,
        "job_id": ticket.job_id,
        "status": "queued",
        "status_url": f"/api/builds/{ticket.build_id}",
    }


def _own(app: App, fields: dict[str, Any], user_id: str) -> None:
    """A user's build is owned by that user (422 naming ``owner_id`` if another is given), for a target of theirs.

    The agent or connector id the user gives is theirs alone (:func:`scoped_target_id`); that the target is
    the owner's is checked again in the build's own transaction (``store.create_build``: 404 otherwise).
    """
    if fields.setdefault("owner_id", user_id) != user_id:
        raise HTTPException(422, [{"loc": ["body", "owner_id"], "msg": "a build belongs to the key's user"}])
    for kind, field in (("agent", "agent_id"), ("connector", "connector_id")):
        target_id = fields.get(field)
        if isinstance(target_id, str) and ID.fullmatch(target_id):  # else the payload's check names the field
            fields[field] = scoped_target_id(app, kind, user_id, target_id)


#: An id a user may give (conveyor.tasks.payloads.Id): only such an id is scoped, a bad one is refused as it is.
ID = re.compile(r"[A-Za-z0-9_.:@\-]{1,128}")


def scoped_target_id(app: App, kind: str, user_id: str, target_id: str) -> str:
    """The stored id of a user's agent or connector: one user's ``a1`` is not another's (see
    :func:`~conveyor.platform.records.scoped_id`), so no answer tells whether another user has an ``a1``,
    and nobody can take a name before its owner does.

    A target its owner made under the bare id before ids were scoped keeps that id: nobody else can
    reach it, and its owner still does (a user cannot make a bare id any more; the admin token can).
    """
    with app.pool.connection() as conn:
        target = store.get_target(conn, kind, target_id)
    if target is not None and target.owner_id == user_id:
        return target_id
    return records.scoped_id(kind, user_id, target_id)


@router.get("/builds/{build_id}")
def get_build(build_id: NamePath, app: ConveyorApp, caller: UserOrAdmin) -> dict[str, Any]:
    with app.pool.connection() as conn:
        record = store.get_build(conn, build_id)
        if record is not None and caller.user_id is not None and record.owner_id != caller.user_id:
            record = None  # another user's build is as missing as none
        if record is None:
            raise not_found("build")
        events = [{"claim": c, "event": e, "detail": d} for c, e, d in store.build_events(conn, build_id)]
    return {**record.as_dict(), "events": events}


@router.get("/deployments/{target_kind}/{target_id}", dependencies=[Depends(require_admin)])
def get_deployment(target_kind: NamePath, target_id: NamePath, app: ConveyorApp) -> dict[str, Any]:
    if target_kind not in ("agent", "connector"):
        raise HTTPException(status.HTTP_404_NOT_FOUND, "target kind is agent or connector")
    with app.pool.connection() as conn:
        target = store.get_target(conn, target_kind, target_id)
        if target is None:
            raise not_found(target_kind)
        deployment = store.get_deployment(conn, target_kind, target_id)
        versions = store.list_versions(conn, target_kind, target_id)
    return {
        "target": target.__dict__,
        "deployment": deployment.as_dict() if deployment else None,
        "versions": [{"version": v, "artifact_sha256": a} for v, a in versions],
    }


# The caller is checked on the route itself (the router has no dependencies), before any byte is read.
@router.post(
    UPLOAD_PATH.removeprefix("/api"),
    status_code=status.HTTP_202_ACCEPTED,
    responses={
        413: {"description": "the upload is larger than CONVEYOR_UPLOAD_MAX_BYTES; nothing was kept"},
        422: {"description": "not a zip, or a form field that is missing or unknown"},
    },
)
async def upload_and_deploy(request: Request, app: ConveyorApp, caller: UserOrAdmin) -> dict[str, Any]:
    """multipart/form-data: ``file`` (a zip), ``agent_id``, ``owner_id`` (a user's key: theirs, may be left out);
    optional ``kind`` (upload, or update for an agent that exists), ``version``, ``changelog``, ``env`` (a JSON
    object of strings)."""
    cap = platform_settings(app).upload_max_bytes
    length = request.headers.get("content-length", "")
    if length.isdigit() and int(length) > cap + FORM_OVERHEAD:
        raise HTTPException(413, f"file: the upload is larger than {cap} bytes")
    ctype, params = parse_options_header(request.headers.get("content-type"))
    if ctype != b"multipart/form-data" or not params.get(b"boundary"):
        raise HTTPException(status.HTTP_415_UNSUPPORTED_MEDIA_TYPE, "the body is multipart/form-data")
    form = _StreamedForm(Uploads(app.settings.data_dir).writer(cap))
    try:
        parser = MultipartParser(params[b"boundary"], form.callbacks(), max_size=cap + FORM_OVERHEAD)
        async for chunk in request.stream():
            parser.write(chunk)
        parser.finalize()
        upload_id = await run_in_threadpool(form.finish, ("agent_id",) if caller.user_id else ("agent_id", "owner_id"))
    except (MultipartParseError, ValueError):
        raise HTTPException(422, "the body is not a well-formed multipart/form-data form") from None
    except ClientDisconnect:
        raise HTTPException(400, "the upload was cut off before its end") from None
    finally:
        form.writer.abort()
    try:
        kind, fields, env = _upload_request(form.fields, upload_id)
        if caller.user_id is not None:
            if not fields.get("owner_id"):
                fields.pop("owner_id", None)  # left empty in the form: the key's user
            await run_in_threadpool(_own, app, fields, caller.user_id)
        ticket = await run_in_threadpool(request_build, app, kind, fields, env=env)
    except (HTTPException, ConveyorError):  # refused (statuses: conveyor.api.errors): nothing will use the upload
        Uploads(app.settings.data_dir).remove(upload_id)
        raise
    return {
        "build_id": ticket.build_id,
        "job_id": ticket.job_id,
        "upload_id": upload_id,
        "status": "queued",
        "status_url": f"/api/builds/{ticket.build_id}",
    }


def _upload_request(fields: dict[str, str], upload_id: str) -> tuple[str, dict[str, Any], dict[str, str]]:
    """(kind, fields, env) of the build an upload form asks for; UploadRefused naming a bad field."""
    kind = fields.pop("kind", "upload")
    if kind not in ("upload", "update"):
        raise UploadRefused("kind: upload or update")
    try:
        env = json.loads(fields.pop("env", "{}") or "{}")
    except (ValueError, RecursionError):  # a deep one, too
        env = None
    if not isinstance(env, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in env.items()):
        raise UploadRefused("env: a JSON object mapping variable names to string values")
    version = fields.pop("version", None)
    if version is not None:
        fields["version" if kind == "upload" else "new_version"] = version
    if kind == "upload":
        fields.pop("changelog", None)
    return kind, {**fields, "upload_id": upload_id}, env


class _StreamedForm:
    """python-multipart callbacks: the ``file`` part goes to disk chunk by chunk, small fields to memory."""

    FIELD_LIMIT = 64 * 1024

    def __init__(self, writer: UploadWriter) -> None:
        self.writer = writer
        self.fields: dict[str, str] = {}
        self._headers: dict[bytes, bytes] = {}
        self._header = b""
        self._value = b""
        self._name: str | None = None
        self._buffer = bytearray()
        self._saw_file = False
        self._done = False

    def callbacks(self) -> MultipartCallbacks:
        return {
            "on_part_begin": self._begin,
            "on_header_field": self._field,
            "on_header_value": self._hvalue,
            "on_header_end": self._header_end,
            "on_headers_finished": self._headers_done,
            "on_part_data": self._data,
            "on_part_end": self._end,
        }

    def _begin(self) -> None:
        self._headers, self._header, self._value, self._name = {}, b"", b"", None
        self._buffer = bytearray()

    def _field(self, data: bytes, start: int, end: int) -> None:
        self._header += data[start:end]

    def _hvalue(self, data: bytes, start: int, end: int) -> None:
        self._value += data[start:end]

    def _header_end(self) -> None:
        self._headers[self._header.lower()] = self._value
        self._header, self._value = b"", b""

    def _headers_done(self) -> None:
        _, options = parse_options_header(self._headers.get(b"content-disposition"))
        name = options.get(b"name", b"").decode("utf-8", "replace")
        if name == "file":
            if self._saw_file:
                raise UploadRefused("file: give one file")
            self._saw_file = True
        elif name not in UPLOAD_FIELDS:
            # The name is the client's: not echoed back.
            raise UploadRefused(f"the upload form has an unknown field; its fields: file, {', '.join(UPLOAD_FIELDS)}")
        elif name in self.fields:
            raise UploadRefused(f"{name}: given twice")
        self._name = name

    def _data(self, data: bytes, start: int, end: int) -> None:
        if self._name == "file":
            self.writer.write(data[start:end])
        else:
            self._buffer += data[start:end]
            if len(self._buffer) > self.FIELD_LIMIT:
                raise UploadRefused(f"{self._name}: longer than {self.FIELD_LIMIT} bytes")

    def _end(self) -> None:
        if self._name != "file" and self._name is not None:
            try:
                self.fields[self._name] = self._buffer.decode("utf-8")
            except UnicodeDecodeError:
                raise UploadRefused(f"{self._name}: not UTF-8 text") from None

    def finish(self, required: tuple[str, ...]) -> str:
        if not self._saw_file:
            raise UploadRefused("file: missing (a zip archive)")
        missing = [name for name in required if not self.fields.get(name)]
        if missing:
            raise UploadRefused(f"{', '.join(missing)}: missing")
        return self.writer.finish()
