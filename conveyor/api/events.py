"""``POST /api/events/{name}``: signal an event (``app.events.signal``), resuming the jobs that wait for it.

The admin token signals any event. A user's API key signals only the events
their own jobs wait for, named ``user:<their user id>:...`` (for example
``user:42:approval:run-7``): a platform user can approve their own run and
no one else's. A name that is not an event name answers 400, one outside the
caller's own answers 403; neither is echoed.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, HTTPException
from fastapi.concurrency import run_in_threadpool
from pydantic import BaseModel, ConfigDict

from conveyor.api.auth import UserOrAdmin
from conveyor.api.deps import ConveyorApp, NamePath
from conveyor.api.errors import UNAVAILABLE_RESPONSES
from conveyor.events import check_name

router = APIRouter(
    prefix="/api/events",
    tags=["events"],
    responses={401: {"description": "no valid API key or admin token"}, **UNAVAILABLE_RESPONSES},
)


def user_prefix(user_id: str) -> str:
    """The names a user's key may signal start with this."""
    return f"user:{user_id}:"


class Signal(BaseModel):
    """The signal's data, handed to every job waiting for the event (``ctx.wait_for`` returns it)."""

    model_config = ConfigDict(extra="forbid")

    data: Any = None


class Signalled(BaseModel):
    """How many jobs the signal resumed (0: none waits yet; the signal is kept for those that will)."""

    resumed: int


@router.post(
    "/{name}",
    response_model=Signalled,
    summary="Signal an event: resume the jobs waiting for it (each once), and keep it for those that will",
    responses={
        400: {"description": "not an event name, or data that is not JSON"},
        403: {"description": "not one of your events"},
        413: {"description": "the data is larger than CONVEYOR_MAX_PAYLOAD_BYTES encoded"},
    },
)
async def signal(name: NamePath, caller: UserOrAdmin, app: ConveyorApp, body: Signal | None = None) -> Signalled:
    check_name(name)
    if not caller.admin and (caller.user_id is None or not name.startswith(user_prefix(caller.user_id))):
        raise HTTPException(403, "a user's key signals only its own events: names starting user:<your user id>:")
    data = body.data if body is not None else None
    resumed = await run_in_threadpool(app.events.signal, name, data)
    return Signalled(resumed=resumed)
