"""/api/schedules: create, list, show, pause, resume and delete cron schedules (admin token required).

Schedules enqueue arbitrary jobs, so every route needs the admin token
(:func:`conveyor.api.auth.require_admin`): closed when none is configured.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from fastapi import APIRouter, Depends, Query, Response, status
from pydantic import BaseModel, ConfigDict, Field

from conveyor.api.auth import require_admin
from conveyor.api.deps import NamePath, conveyor_app
from conveyor.api.errors import UNAVAILABLE_RESPONSES
from conveyor.platform.scheduling import schedules
from conveyor.platform.scheduling.schedules import Schedule

if TYPE_CHECKING:
    from conveyor.app import App

router = APIRouter(
    prefix="/api/schedules",
    tags=["schedules"],
    dependencies=[Depends(require_admin)],
    responses={
        401: {"description": "no valid admin token"},
        403: {"description": "closed: CONVEYOR_ADMIN_TOKEN is not set"},
        **UNAVAILABLE_RESPONSES,
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


@router.post("", status_code=status.HTTP_201_CREATED)
def create_schedule(body: ScheduleIn, app: App = Depends(conveyor_app)) -> dict[str, Any]:
    with app.pool.connection() as conn:
        return _out(schedules.create_schedule(conn, app.job_types, **body.model_dump()))


@router.get("")
def list_schedules(
    limit: int = Query(100, ge=1, le=1000), offset: int = Query(0, ge=0, le=10**9), app: App = Depends(conveyor_app)
) -> list[dict[str, Any]]:
    with app.pool.connection() as conn:
        return [_out(s) for s in schedules.list_schedules(conn, limit=limit, offset=offset)]


@router.get("/{schedule_id}")
def get_schedule(schedule_id: NamePath, app: App = Depends(conveyor_app)) -> dict[str, Any]:
    with app.pool.connection() as conn:
        schedule = schedules.get_schedule(conn, schedule_id)
        fires = schedules.fires(conn, schedule.id)[-50:]
    return {**_out(schedule), "fires": [f.as_dict() for f in fires]}


@router.post("/{schedule_id}/pause")
def pause_schedule(schedule_id: NamePath, app: App = Depends(conveyor_app)) -> dict[str, Any]:
    with app.pool.connection() as conn:
        return _out(schedules.pause_schedule(conn, schedule_id))


@router.post("/{schedule_id}/resume")
def resume_schedule(schedule_id: NamePath, app: App = Depends(conveyor_app)) -> dict[str, Any]:
    with app.pool.connection() as conn:
        return _out(schedules.resume_schedule(conn, schedule_id))


@router.delete("/{schedule_id}", status_code=status.HTTP_204_NO_CONTENT)
def delete_schedule(schedule_id: NamePath, app: App = Depends(conveyor_app)) -> Response:
    with app.pool.connection() as conn:
        schedules.delete_schedule(conn, schedule_id)
    return Response(status_code=status.HTTP_204_NO_CONTENT)
