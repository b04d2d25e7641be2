"""``/api/admin/cron``: the library's managed cron schedules (``app.cron``) over HTTP, admin token only.

``PUT /api/admin/cron/{name}`` stores (or replaces) one, ``GET`` lists every schedule (those
declared in code too, ``source: "code"``, read-only), ``POST .../pause`` and ``.../resume``,
``DELETE`` removes one. A bad name, cron, zone, job or payload is a 422 that names the field
and the rule, never the value sent.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from fastapi import APIRouter, Depends
from pydantic import BaseModel, ConfigDict, Field

from conveyor.api.admin import schema_of
from conveyor.api.auth import require_admin
from conveyor.api.deps import ConveyorApp, NamePath
from conveyor.api.errors import UNAVAILABLE_RESPONSES
from conveyor.scheduling.managed import CronSchedule

router = APIRouter(
    prefix="/api/admin/cron",
    tags=["admin"],
    dependencies=[Depends(require_admin)],
    responses={
        401: {"description": "no valid admin token"},
        403: {"description": "closed: CONVEYOR_ADMIN_TOKEN is not set"},
        **UNAVAILABLE_RESPONSES,
    },
)

NOT_FOUND: dict[int | str, dict[str, Any]] = {
    404: {"description": "no schedule has this name (the answer: no such schedule)"}
}
CODE: dict[int | str, dict[str, Any]] = {
    422: {"description": "a schedule declared in code (jobs.schedule): change it there"}
}


if TYPE_CHECKING:
    # What mypy sees; at run time it is generated from app.cron's row (one row type per concept).
    class CronOut(BaseModel): ...

else:
    CronOut = schema_of(
        CronSchedule,
        """A cron schedule. ``source``: ``code`` (declared with jobs.schedule, read-only here) or ``managed``.
    ``nextFire``: its next occurrence (null while paused).""",
    )


class CronIn(BaseModel):
    """A managed schedule: ``job`` with ``payload`` at each occurrence of ``cron`` in zone ``tz``."""

    model_config = ConfigDict(extra="forbid")

    cron: str = Field(min_length=1, max_length=200)
    job: str = Field(min_length=1, max_length=200)
    payload: dict[str, Any] = Field(default_factory=dict)
    tz: str = Field("UTC", min_length=1, max_length=200)
    paused: bool = False


def _out(schedule: CronSchedule) -> CronOut:
    return CronOut.model_validate(schedule)


@router.get("", response_model=list[CronOut], summary="Every cron schedule, code and managed, by name")
def list_cron(app: ConveyorApp) -> list[CronOut]:
    return [_out(s) for s in app.cron.list()]


@router.get("/{name}", response_model=CronOut, summary="One cron schedule", responses=NOT_FOUND)
def get_cron(name: NamePath, app: ConveyorApp) -> CronOut:
    return _out(app.cron.get(name))


@router.put(
    "/{name}",
    response_model=CronOut,
    summary="Store a managed cron schedule, or replace the one of this name; it fires from the next pass",
    responses={422: {"description": "a bad name, cron, zone, job or payload, or a name a code schedule has"}},
)
def put_cron(name: NamePath, body: CronIn, app: ConveyorApp) -> CronOut:
    return _out(app.cron.add(name, cron=body.cron, job=body.job, payload=body.payload, tz=body.tz, paused=body.paused))


@router.post("/{name}/pause", response_model=CronOut, summary="Stop firing it", responses={**NOT_FOUND, **CODE})
def pause_cron(name: NamePath, app: ConveyorApp) -> CronOut:
    return _out(app.cron.pause(name))


@router.post(
    "/{name}/resume",
    response_model=CronOut,
    summary="Fire it again, from its next occurrence",
    responses={**NOT_FOUND, **CODE},
)
def resume_cron(name: NamePath, app: ConveyorApp) -> CronOut:
    return _out(app.cron.resume(name))


@router.delete("/{name}", status_code=204, summary="Remove a managed cron schedule", responses={**NOT_FOUND, **CODE})
def remove_cron(name: NamePath, app: ConveyorApp) -> None:
    app.cron.remove(name)
