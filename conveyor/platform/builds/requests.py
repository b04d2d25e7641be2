"""What a producer calls to start a build: encrypt the env, write the rows, enqueue agent.build."""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from conveyor.errors import EnqueueError, InvalidPayload
from conveyor.platform.builds import store
from conveyor.platform.builds.payloads import BuildPayload
from conveyor.secrets import encrypt_env
from conveyor.tasks.jobqueue import validate_payload

if TYPE_CHECKING:
    from conveyor.app import App

JOB = "agent.build"


@dataclass(frozen=True)
class BuildTicket:
    """A requested build: poll ``builds`` (or GET /api/builds/{build_id}) for its outcome."""

    build_id: str
    job_id: str
    deduplicated: bool


def new_build_id() -> str:
    return f"bld_{uuid.uuid4().hex}"


def build_key(build_id: str) -> str:
    """The enqueue key of a build: one job per build, however often it is requested."""
    return f"build:{build_id}"


def _utf8(value: str) -> bool:
    """Whether ``value`` encodes as UTF-8 (a str from JSON may hold a lone surrogate, which does not)."""
    try:
        value.encode()
    except UnicodeEncodeError:
        return False
    return True


def request_build(
    app: "App",
    kind: str,
    fields: Mapping[str, Any],
    *,
    env: Mapping[str, str] | None = None,
    build_id: str | None = None,
    host_paths: bool = False,
) -> BuildTicket:
    """Validate, encrypt ``env`` (plain values in, Fernet tokens out), record and enqueue one build.

    Requesting the same ``build_id`` again changes nothing and returns the first job. Raises
    :class:`~conveyor.errors.InvalidPayload` (naming fields, never values) or
    :class:`~conveyor.errors.SecretKeyError`; then nothing was recorded.

    ``host_paths`` lets the request name archives, directories and local repositories on the
    build host (the worker still takes them only under ``CONVEYOR_BUILD_SOURCE_ROOTS``): for
    operators' own code and CLI, never for requests from HTTP, which upload instead.
    """
    if env and not all(_utf8(value) for value in env.values()):
        # A JSON body may carry a lone surrogate ("\\ud800"), which no UTF-8 encoder (nor Fernet) takes.
        # Neither the value nor its name is quoted: both are the request's.
        raise InvalidPayload(JOB, [{"loc": ("env",), "msg": "every value must be UTF-8 text"}])
    if env and any("\0" in value for value in env.values()):
        # No environment can carry it (and the sandbox refuses it): name the variables, not the values.
        names = sorted(name for name, value in env.items() if "\0" in value)
        raise InvalidPayload(JOB, [{"loc": ("env", name), "msg": "a value may not hold a NUL byte"} for name in names])
    data = {**fields, "kind": kind, "build_id": build_id or new_build_id(), "env": encrypt_env(app.settings, env or {})}
    payload = validate_payload(JOB, BuildPayload, data)
    request = payload.root
    named = request.host_paths()
    if named and not host_paths:
        raise InvalidPayload(
            JOB,
            [
                {"loc": (name,), "msg": "host paths are not accepted here: upload the source and give upload_id"}
                for name in named
            ],
        )
    with app.pool.connection() as conn:
        if not store.create_build(conn, request):
            existing = store.get_build(conn, request.build_id)
            # Requested before: that request's job and outcome stand, unless the process that made
            # the row died before its enqueue was recorded; then enqueue now (the job key makes a
            # job that did reach the broker a no-op).
            if existing is None or existing.job_id or existing.status != "queued":
                return BuildTicket(request.build_id, (existing.job_id if existing else None) or "", True)
    # No database connection is held across the enqueue: a broker that is away would keep it for
    # the client's whole timeout and retries, and enough such requests would drain the App's pool.
    try:
        ref = app.jobs.enqueue(JOB, payload, key=build_key(request.build_id))
    except EnqueueError as exc:
        # Nothing will ever run it: end it now rather than leave its target "building".
        with app.pool.connection() as conn:
            store.fail_build(conn, request.build_id, f"not enqueued: {exc}")
        raise
    with app.pool.connection() as conn:
        store.set_build_job(conn, request.build_id, ref.id)
    return BuildTicket(request.build_id, ref.id, ref.deduplicated)
