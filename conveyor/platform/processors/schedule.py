"""schedule.fire: one occurrence of a schedule enqueues the schedule's job, unless it was paused or deleted."""

from __future__ import annotations

from typing import Any

from conveyor.errors import InvalidPayload, UnknownJob
from conveyor.logs import log_event
from conveyor.platform.blueprint import jobs
from conveyor.platform.queues import SCHEDULING
from conveyor.platform.scheduling import schedules
from conveyor.platform.scheduling.payloads import ScheduleFire
from conveyor.platform.scheduling.scheduler import fire_key
from conveyor.tasks.context import JobContext


@jobs.job("schedule.fire", queue=SCHEDULING, payload=ScheduleFire)
def fire_schedule(payload: ScheduleFire, ctx: JobContext) -> None:
    ids: dict[str, Any] = dict(queue=ctx.queue, job=ctx.job, job_id=ctx.job_id, attempt=ctx.attempt)
    with ctx.app.pool.connection() as conn:
        schedule = schedules.find_schedule(conn, payload.schedule_id)
    if schedule is None:
        log_event("skipped", **ids, schedule_id=payload.schedule_id, reason="schedule was deleted")
        return
    if not schedule.enabled:
        _skip(ctx, payload, ids, "schedule is paused")
        return
    try:
        # Keyed by the occurrence: a second run of this job enqueues nothing new.
        ref = ctx.app.jobs.enqueue(
            schedule.job, schedule.payload, key=f"{fire_key(schedule.id, payload.fire_time)}:run"
        )
    except (UnknownJob, InvalidPayload) as exc:
        # The code changed under the schedule: firing again would not help.
        _skip(ctx, payload, ids, str(exc))
        return
    with ctx.app.pool.connection() as conn:
        schedules.record_fire(conn, schedule.id, payload.fire_time, status="enqueued", job_id=ref.id)
    log_event(
        "schedule_job_enqueued",
        **ids,
        schedule_id=schedule.id,
        fire_time=payload.fire_time.isoformat(),
        target_job=schedule.job,
        target_job_id=ref.id,
        deduplicated=ref.deduplicated,
    )


def _skip(ctx: JobContext, payload: ScheduleFire, ids: dict[str, Any], reason: str) -> None:
    with ctx.app.pool.connection() as conn:
        schedules.record_fire(conn, payload.schedule_id, payload.fire_time, status="skipped", reason=reason)
    log_event("skipped", **ids, schedule_id=payload.schedule_id, fire_time=payload.fire_time.isoformat(), reason=reason)
