"""nudge.fire: send a nudge, or skip it -- with the reason logged -- if the user replied or the task closed."""

from __future__ import annotations

from ...errors import InvalidPayload, PermanentError, RetryLater, UnknownJob
from ...logs import log_event
from ...scheduling.nudges import nudge_key
from ...scheduling.payloads import NudgeFire
from ...scheduling.schedules import QUERIES, db_now
from ...tasks.jobqueue import MAX_DELAY_SECONDS
from ..context import JobContext
from ..registry import job
from .resume import EARLY_TOLERANCE


@job("nudge.fire", queue="nudge", payload=NudgeFire)
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
        early = (fire_at - db_now(conn, None)).total_seconds()
        if early > EARLY_TOLERANCE:
            raise RetryLater(f"nudge is due at {fire_at.isoformat()}", delay=min(early, MAX_DELAY_SECONDS))
        try:
            ref = ctx.app.jobs.enqueue(nudge_job, nudge_payload, key=f"{nudge_key(payload.nudge_id)}:send")
        except (UnknownJob, InvalidPayload) as exc:
            raise PermanentError(f"cannot send nudge {payload.nudge_id}: {exc}") from None
        conn.execute(QUERIES["nudge_sent"], {"id": payload.nudge_id, "job_id": ref.id})
    log_event("nudge_sent", **ids, nudge_id=payload.nudge_id, task_id=task_id, nudge_job=nudge_job,
              nudge_job_id=ref.id)
