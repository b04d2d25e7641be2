"""nudge.fire: send a nudge, or skip it -- with the reason logged -- if the user replied or the task closed."""

from __future__ import annotations

from conveyor.logs import log_event
from conveyor.platform.queues import NUDGE
from conveyor.platform.scheduling.followups import defer_if_early, enqueue_follow_up
from conveyor.platform.scheduling.nudges import nudge_key
from conveyor.platform.scheduling.payloads import NudgeFire
from conveyor.platform.scheduling.schedules import QUERIES
from conveyor.tasks.context import JobContext
from conveyor.tasks.registry import job


@job("nudge.fire", queue=NUDGE, payload=NudgeFire)
def fire_nudge(payload: NudgeFire, ctx: JobContext) -> None:
    ids = dict(queue=ctx.queue, job=ctx.job, job_id=ctx.job_id, attempt=ctx.attempt)
    with ctx.app.pool.connection() as conn, conn.transaction():
        row = conn.execute(QUERIES["nudge_lock"], {"id": payload.nudge_id}).fetchone()
        if row is None:
            log_event("skipped", **ids, nudge_id=payload.nudge_id, reason="nudge no longer exists")
            return
        task_id, status, fire_at, nudge_job, nudge_payload, task_closed, user_replied = row
        if status != "scheduled":
            log_event("skipped", **ids, nudge_id=payload.nudge_id, task_id=task_id, reason=f"nudge already {status}")
            return
        # Checked before the time: a long nudge re-deferred in hops resolves at the first hop after a reply.
        reason = "task_closed" if task_closed else "user_replied" if user_replied else None
        if reason:
            conn.execute(QUERIES["nudge_skipped"], {"id": payload.nudge_id, "reason": reason})
            log_event("skipped", **ids, nudge_id=payload.nudge_id, task_id=task_id, reason=reason)
            return
        defer_if_early(conn, fire_at, f"nudge {payload.nudge_id}")
        ref = enqueue_follow_up(
            ctx.app, nudge_job, nudge_payload, f"{nudge_key(payload.nudge_id)}:send", f"send nudge {payload.nudge_id}"
        )
        conn.execute(QUERIES["nudge_sent"], {"id": payload.nudge_id, "job_id": ref.id})
    log_event("nudge_sent", **ids, nudge_id=payload.nudge_id, task_id=task_id, nudge_job=nudge_job, nudge_job_id=ref.id)
