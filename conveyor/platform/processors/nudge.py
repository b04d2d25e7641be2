"""nudge.fire: send a nudge, or skip it -- with the reason logged -- if the user replied or the task closed."""

from __future__ import annotations

from typing import Any

from conveyor.logs import log_event
from conveyor.platform.blueprint import jobs
from conveyor.platform.queues import NUDGE
from conveyor.platform.scheduling import nudges
from conveyor.platform.scheduling.followups import defer_if_early, enqueue_follow_up
from conveyor.platform.scheduling.payloads import NudgeFire
from conveyor.tasks.context import JobContext


@jobs.job("nudge.fire", queue=NUDGE, payload=NudgeFire)
def fire_nudge(payload: NudgeFire, ctx: JobContext) -> None:
    ids: dict[str, Any] = dict(queue=ctx.queue, job=ctx.job, job_id=ctx.job_id, attempt=ctx.attempt)
    with ctx.app.pool.connection() as conn, conn.transaction():
        nudge = nudges.lock_nudge(conn, payload.nudge_id)
        if nudge is None:
            log_event("skipped", **ids, nudge_id=payload.nudge_id, reason="nudge no longer exists")
            return
        task_id = nudge.task_id
        if nudge.status != "scheduled":
            log_event(
                "skipped", **ids, nudge_id=payload.nudge_id, task_id=task_id, reason=f"nudge already {nudge.status}"
            )
            return
        # Checked before the time: a long nudge re-deferred in hops resolves at the first hop after a reply.
        reason = "task_closed" if nudge.task_closed else "user_replied" if nudge.user_replied else None
        if reason:
            nudges.mark_skipped(conn, payload.nudge_id, reason)
            log_event("skipped", **ids, nudge_id=payload.nudge_id, task_id=task_id, reason=reason)
            return
        defer_if_early(conn, nudge.fire_at, f"nudge {payload.nudge_id}")
        ref = enqueue_follow_up(
            ctx.app,
            nudge.job,
            nudge.payload,
            f"{nudges.nudge_key(payload.nudge_id)}:send",
            f"send nudge {payload.nudge_id}",
        )
        nudges.mark_sent(conn, payload.nudge_id, ref.id)
    log_event("nudge_sent", **ids, nudge_id=payload.nudge_id, task_id=task_id, nudge_job=nudge.job, nudge_job_id=ref.id)
