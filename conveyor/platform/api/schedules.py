"""/api/schedules: create, list, show, pause, resume and delete cron schedules (admin token required).

Schedules enqueue arbitrary jobs, so every route needs the admin token
(:func:`conveyor.api.auth.require_admin`): closed when none is configured.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends, HTTPException, Query, Response, status
from pydantic import BaseModel, ConfigDict, Field

from conveyor.api.auth import require_admin
from conveyor.api.deps import NamePath, conveyor_app
from conveyor.api.errors import not_found
from conveyor.errors import InvalidSchedule, ScheduleNotFound
from conveyor.platform.scheduling.schedules import Schedule, Schedules

router = APIRouter(
    prefix="/api/schedules",
    tags=["schedules"],
    dependencies=[Depends(require_admin)],
    responses={
        401: {"description": "no valid admin token"},
        403: {"description": "closed: CONVEYOR_ADMIN_TOKEN is not set"},
    },
)


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
        return not_found("schedule")
    return HTTPException(422, str(exc))


@router.post("", status_code=status.HTTP_201_CREATED)
def create_schedule(body: ScheduleIn, app=Depends(conveyor_app)) -> dict[str, Any]:
    try:
        return _out(Schedules(app).create(**body.model_dump()))
    except InvalidSchedule as exc:
        raise _errors(exc) from None


@router.get("")
def list_schedules(
    limit: int = Query(100, ge=1, le=1000), offset: int = Query(0, ge=0, le=10**9), app=Depends(conveyor_app)
) -> list[dict[str, Any]]:
    return [_out(s) for s in Schedules(app).list(limit=limit, offset=offset)]


@router.get("/{schedule_id}")
def get_schedule(schedule_id: NamePath, app=Depends(conveyor_app)) -> dict[str, Any]:
    schedules = Schedules(app)
    try:
        schedule = schedules.get(schedule_id)
    except ScheduleNotFound as exc:
        raise _errors(exc) from None
    return {**_out(schedule), "fires": schedules.fires(schedule.id)[-50:]}


@router.post("/{schedule_id}/pause")
def pause_schedule(schedule_id: NamePath, app=Depends(conveyor_app)) -> dict[str, Any]:
    try:
        return _out(Schedules(app).pause(schedule_id))
    except ScheduleNotFound as exc:
        raise _errors(exc) from None


@router.post("/{schedule_id}/resume")
def resume_schedule(schedule_id: NamePath, app=Depends(conveyor_app)) -> dict[str, Any]:
    try:
        return _out(Schedules(app).resume(schedule_id))
    except (ScheduleNotFound, InvalidSchedule) as exc:
        raise _errors(exc) from None


@router.delete("/{schedule_id}", status_code=status.HTTP_204_NO_CONTENT)
def delete_schedule(schedule_id: NamePath, app=Depends(conveyor_app)) -> Response:
    try:
        Schedules(app).delete(schedule_id)
    except ScheduleNotFound as exc:
        raise _errors(exc) from None
    return Response(status_code=status.HTTP_204_NO_CONTENT)
