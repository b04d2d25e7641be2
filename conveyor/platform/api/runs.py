"""Producer routes of the agent platform: start a run (202), follow its stream (SSE), read its status.

``POST /api/tasks/{task_id}/runs`` adds the user's message and enqueues the
run; ``GET /api/runs/{run_id}/stream`` is Server-Sent Events, one event per
chunk with ``id: <seq>``, so a client that reconnects with
``Last-Event-ID`` resumes after the last chunk it got, never receiving one
twice; ``GET /api/runs/{run_id}`` is the run as the database has it.

Every route needs a user's API key (:func:`~conveyor.api.auth.require_user`)
and sees only that user's tasks and runs: another user's id answers 404
with the same body as an id that does not exist. A client-chosen
``message_id`` is the user's own (:func:`~conveyor.platform.records.scoped_message_id`).

Per-user quotas (:mod:`conveyor.platform.quotas`) answer 429 naming the
limit: runs queued or running (``CONVEYOR_USER_MAX_ACTIVE_RUNS``), stream
data kept (``CONVEYOR_USER_MAX_STREAM_BYTES``), open streams
(``CONVEYOR_USER_MAX_STREAMS``). An open stream waits on a wake-up from the
stream store, not a timer.

The routers need the conveyor :class:`~conveyor.app.App` in
``request.app.state.conveyor`` (see :func:`conveyor.api.deps.conveyor_app`).
"""

from __future__ import annotations

import asyncio
import json
import time
from datetime import datetime
from typing import TYPE_CHECKING, Annotated, Any, AsyncIterator

from fastapi import APIRouter, Header, HTTPException, Path, Query, Request, Response
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import StreamingResponse
from pydantic import BaseModel, Field

from conveyor.api.auth import UserId
from conveyor.api.deps import ConveyorApp
from conveyor.api.errors import UNAVAILABLE_RESPONSES
from conveyor.errors import DatabaseUnavailable
from conveyor.platform import quotas, records
from conveyor.platform.quotas import RunQuota
from conveyor.platform.rounds import cancel_round, start_round
from conveyor.platform.settings import platform_settings
from conveyor.platform.streams import buffer_for
from conveyor.tasks.payloads import Id

if TYPE_CHECKING:
    from conveyor.app import App

router = APIRouter(prefix="/api", tags=["runs"], responses=UNAVAILABLE_RESPONSES)

#: Every producer route answers these besides its own.
AUTH_RESPONSES: dict[int | str, dict[str, Any]] = {401: {"description": "no valid API key"}}

#: Largest chunk number a client may resume after (``run_chunks.seq`` is an INTEGER).
MAX_SEQ = 2**31 - 1

#: Seconds between SSE comments that keep idle proxies from closing the stream.
KEEPALIVE_SECONDS = 15.0

#: Seconds of an idle stream between looks at the run's status in the database,
#: for a run that ended without an end entry (its stream expired, say).
STATUS_CHECK_SECONDS = 2.0

IdPath = Annotated[str, Path(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9_.:@\-]+$")]


class StartRun(BaseModel):
    """The user's message that starts a round."""

    content: str = Field(min_length=1, max_length=100_000)
    #: Optional: a client-chosen ID makes a retried POST return the first run instead of starting another.
    message_id: Id | None = None


class RunAccepted(BaseModel):
    run_id: str
    task_id: str
    user_message_id: str
    assistant_message_id: str
    job_id: str
    created: bool
    stream_url: str
    status_url: str


class RunStatus(BaseModel):
    id: str
    task_id: str
    job: str
    status: str
    attempts: int
    user_message_id: str
    assistant_message_id: str
    prompt_tokens: int | None
    completion_tokens: int | None
    total_tokens: int | None
    error: str | None
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    finalized_at: datetime | None
    stream_url: str


def stream_url(run_id: str) -> str:
    return f"/api/runs/{run_id}/stream"


@router.post(
    "/tasks/{task_id}/runs",
    status_code=202,
    response_model=RunAccepted,
    responses={
        **AUTH_RESPONSES,
        404: {"description": "no such task of yours"},
        409: {"description": "you used this message ID for other content"},
        429: {"description": "you have as many runs going, or as much stream data kept, as you may"},
    },
)
def post_run(task_id: IdPath, body: StartRun, response: Response, app: ConveyorApp, user_id: UserId) -> RunAccepted:
    """Start a round of one of your tasks (API key); the run happens on a worker. Answers 202 with where to follow it."""
    message_id = records.scoped_message_id(user_id, body.message_id) if body.message_id else None
    # Not found, a conflict, the broker away: conveyor.api.errors' table answers (404, 409, 503).
    with app.pool.connection() as conn:
        records.get_task_of(conn, task_id, user_id)  # another user's task is as missing as none
    started = start_round(
        app, task_id=task_id, content=body.content, message_id=message_id, quota=RunQuota.of(platform_settings(app))
    )
    status_url = f"/api/runs/{started.run_id}"
    response.headers["Location"] = status_url
    return RunAccepted(
        run_id=started.run_id,
        task_id=started.task_id,
        user_message_id=started.user_message_id,
        assistant_message_id=started.assistant_message_id,
        job_id=started.job_id,
        created=started.created,
        stream_url=stream_url(started.run_id),
        status_url=status_url,
    )


def _load_run(app: App, run_id: str, user_id: str) -> records.Run:
    with app.pool.connection() as conn:
        return records.get_run_of(conn, run_id, user_id)  # RecordNotFound: 404 "no such run" (api/errors.py)


@router.get(
    "/runs/{run_id}",
    response_model=RunStatus,
    responses={**AUTH_RESPONSES, 404: {"description": "no such run of yours"}},
)
def get_run(run_id: IdPath, app: ConveyorApp, user_id: UserId) -> RunStatus:
    """One of your runs (API key) as the database has it: status, attempts, token usage, error."""
    run = _load_run(app, run_id, user_id)
    return RunStatus(
        **{k: getattr(run, k) for k in RunStatus.model_fields if k != "stream_url"}, stream_url=stream_url(run.id)
    )


@router.post(
    "/runs/{run_id}/cancel",
    response_model=RunStatus,
    responses={**AUTH_RESPONSES, 404: {"description": "no such run of yours"}, 409: {"description": "it has ended"}},
)
def cancel_run(run_id: IdPath, app: ConveyorApp, user_id: UserId) -> RunStatus:
    """Stop one of your runs (API key): a queued one never starts; a running one is stopped where it runs,
    keeps the reply streamed so far, and its stream ends with ``event: end`` ``{"status": "cancelled"}``."""
    run = _load_run(app, run_id, user_id)  # another user's run is as missing as none
    if run.terminal:
        raise HTTPException(409, "the run has ended: there is nothing to cancel")
    cancel_round(app, run)
    return get_run(run_id, app, user_id)


@router.get(
    "/runs/{run_id}/stream",
    responses={
        200: {"content": {"text/event-stream": {}}, "description": "chunk events, then one end event"},
        400: {"description": "Last-Event-ID is not a chunk number"},
        **AUTH_RESPONSES,
        404: {"description": "no such run of yours"},
        429: {"description": "you have as many streams open as you may (CONVEYOR_USER_MAX_STREAMS)"},
    },
)
async def get_run_stream(
    run_id: IdPath,
    request: Request,
    app: ConveyorApp,
    user_id: UserId,
    last_event_id: Annotated[str | None, Header()] = None,
    after: Annotated[int | None, Query(ge=0, le=MAX_SEQ, description="resume after this seq")] = None,
) -> StreamingResponse:
    """Server-Sent Events of one of your runs (API key): ``event: chunk`` (``{"text"}``) per chunk, then
    ``event: end`` (``{"status"}``).

    Resumable: reconnect with ``Last-Event-ID`` (or ``?after=``) to get only what follows.
    """
    start = after or 0
    if last_event_id is not None:
        text = last_event_id.strip()
        # ASCII digits only (str.isdigit takes '²'), and no more than a chunk number can be.
        if not (text.isascii() and text.isdigit() and len(text) <= 10 and int(text) <= MAX_SEQ):
            raise HTTPException(400, "Last-Event-ID must be the number of the last chunk received")
        start = int(text)
    await run_in_threadpool(_load_run, app, run_id, user_id)
    lease_id = await run_in_threadpool(_open_stream, app, user_id, run_id)
    return StreamingResponse(
        _events(app, run_id, start, user_id, lease_id),
        media_type="text/event-stream",
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
    )


async def _events(app: App, run_id: str, after: int, user_id: str, lease_id: str) -> AsyncIterator[str]:
    buffer = buffer_for(app)
    lease = platform_settings(app).user_stream_lease
    # The longest wait for a chunk: then the run's status is looked at, and the stream's place renewed.
    wait = min(STATUS_CHECK_SECONDS, lease / 3)
    try:
        async with buffer.follow(run_id) as follower:
            yield "retry: 1000\n\n"
            last_sent = last_status_check = last_renewal = time.monotonic()
            terminal_seen = False
            while True:
                entries = await follower.entries(after, wait)  # a wake-up from the store, not a timer
                for entry in entries:
                    after = entry.seq
                    if entry.kind == "end":
                        yield _event(entry.seq, "end", {"status": entry.data})
                        return
                    yield _event(entry.seq, "chunk", {"text": entry.data})
                now = time.monotonic()
                if now - last_renewal >= lease / 3:
                    last_renewal = now
                    if not await run_in_threadpool(_renew_stream, app, lease_id, lease):
                        return  # its place ran out (the database was away): the client reconnects and asks again
                if entries:
                    last_sent = now
                    continue
                if now - last_status_check >= STATUS_CHECK_SECONDS:
                    last_status_check = now
                    run = await run_in_threadpool(_load_run, app, run_id, user_id)
                    # Seen ended twice with nothing new in between: no end entry is coming (expired stream).
                    if run.terminal and terminal_seen:
                        yield _event(after + 1, "end", {"status": run.status})
                        return
                    terminal_seen = run.terminal
                if now - last_sent >= KEEPALIVE_SECONDS:
                    last_sent = now
                    yield ": keep-alive\n\n"
    finally:
        # Also when the client went away (this generator cancelled): the place is given back now.
        await asyncio.shield(run_in_threadpool(_close_stream, app, lease_id))


def _open_stream(app: App, user_id: str, run_id: str) -> str:
    """A place among the user's open streams (QuotaExceeded: 429 when they hold them all)."""
    settings = platform_settings(app)
    with app.pool.connection() as conn:
        return quotas.open_stream(
            conn, user_id, run_id, limit=settings.user_max_streams, lease=settings.user_stream_lease
        )


def _renew_stream(app: App, lease_id: str, lease: float) -> bool:
    try:
        with app.pool.connection() as conn:
            return quotas.renew_stream(conn, lease_id, lease=lease)
    except DatabaseUnavailable:
        return True  # not lost yet: the lease has slack for the next try


def _close_stream(app: App, lease_id: str) -> None:
    try:
        with app.pool.connection() as conn:
            quotas.close_stream(conn, lease_id)
    except DatabaseUnavailable:
        pass  # its lease runs out on its own


def _event(seq: int, name: str, data: dict[str, Any]) -> str:
    return f"id: {seq}\nevent: {name}\ndata: {json.dumps(data, separators=(',', ':'))}\n\n"
