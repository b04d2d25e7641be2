"""/api/schedules: create, list, show, pause, resume and delete cron schedules (admin token required).

The routes read the process's :class:`~conveyor.app.App` from
``request.app.state.conveyor`` (:func:`conveyor.api.runs.conveyor_app`). Schedules enqueue arbitrary jobs, so every
route needs ``Authorization: Bearer $CONVEYOR_ADMIN_TOKEN``; with no token
configured they are closed.
"""

from __future__ import annotations

import hmac
from typing import Any

from fastapi import APIRouter, Depends, HTTPException, Request, Response, status
from pydantic import BaseModel, ConfigDict, Field

from ..errors import InvalidSchedule, ScheduleNotFound
from ..scheduling.schedules import Schedule, Schedules
from .runs import conveyor_app


def require_admin(request: Request, app=Depends(conveyor_app)) -> None:
    """401 unless the request carries the admin token; closed when none is configured."""
    token = app.settings.admin_token
    if token is None:
        raise HTTPException(status.HTTP_401_UNAUTHORIZED, "admin routes are closed: CONVEYOR_ADMIN_TOKEN is not set")
    scheme, _, given = request.headers.get("authorization", "").partition(" ")
    if scheme.lower() != "bearer" or not hmac.compare_digest(given.encode(), token.get_secret_value().encode()):
        raise HTTPException(status.HTTP_401_UNAUTHORIZED, "a valid admin bearer token is required",
                            headers={"WWW-Authenticate": "Bearer"})


router = APIRouter(prefix="/api/schedules", tags=["schedules"], dependencies=[Depends(require_admin)])


class ScheduleIn(BaseModel):
    """A schedule to create. Cron, zone, policy, job and payload are all checked before it is stored."""

    model_config = ConfigDict(extra="forbid")

    cron: str = Field(description="five-field cron expression, or an alias such as @daily")
    job: str = Field(description="the job each occurrence enqueues")
    payload: dict[str, Any] = Field(default_factory=dict, description="the job's payload")
    timezone: str = Field("UTC", description="IANA zone the cron expression is read in")
    name: str | None = Field(None, description="unique name, usable instead of the id")
    misfire_policy: str = Field("once", description="once (default) | skip | all: what happens after downtime")
    enabled: bool = True


def _out(schedule: Schedule) -> dict[str, Any]:
    return schedule.as_dict()


def _errors(exc: Exception) -> HTTPException:
    if isinstance(exc, ScheduleNotFound):
        return HTTPException(status.HTTP_404_NOT_FOUND, str(exc))
    return HTTPException(422, str(exc))


@router.post("", status_code=status.HTTP_201_CREATED)
def create_schedule(body: ScheduleIn, app=Depends(conveyor_app)) -> dict[str, Any]:
    try:
        return _out(Schedules(app).create(**body.model_dump()))
    except InvalidSchedule as exc:
        raise _errors(exc) from None


@router.get("")
def list_schedules(limit: int = 100, offset: int = 0, app=Depends(conveyor_app)) -> list[dict[str, Any]]:
    return [_out(s) for s in Schedules(app).list(limit=min(max(limit, 1), 1000), offset=max(offset, 0))]


@router.get("/{schedule_id}")
def get_schedule(schedule_id: str, app=Depends(conveyor_app)) -> dict[str, Any]:
    schedules = Schedules(app)
    try:
        schedule = schedules.get(schedule_id)
    except ScheduleNotFound as exc:
        raise _errors(exc) from None
    return {**_out(schedule), "fires": schedules.fires(schedule.id)[-50:]}


@router.post("/{schedule_id}/pause")
def pause_schedule(schedule_id: str, app=Depends(conveyor_app)) -> dict[str, Any]:
    try:
        return _out(Schedules(app).pause(schedule_id))
    except ScheduleNotFound as exc:
        raise _errors(exc) from None


@router.post("/{schedule_id}/resume")
def resume_schedule(schedule_id: str, app=Depends(conveyor_app)) -> dict[str, Any]:
    try:
        return _out(Schedules(app).resume(schedule_id))
    except (ScheduleNotFound, InvalidSchedule) as exc:
        raise _errors(exc) from None


@router.delete("/{schedule_id}", status_code=status.HTTP_204_NO_CONTENT)
def delete_schedule(schedule_id: str, app=Depends(conveyor_app)) -> Response:
    try:
        Schedules(app).delete(schedule_id)
    except ScheduleNotFound as exc:
        raise _errors(exc) from None
    return Response(status_code=status.HTTP_204_NO_CONTENT)
