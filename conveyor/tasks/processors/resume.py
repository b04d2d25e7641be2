"""wait_and_resume: resume a paused run by enqueueing its resume job, unless the run was cancelled."""

from __future__ import annotations

from ...errors import InvalidPayload, PermanentError, RetryLater, UnknownJob
from ...logs import log_event
from ...scheduling.pauses import resume_key
from ...scheduling.payloads import WaitAndResume
from ...scheduling.schedules import QUERIES, db_now
from ...tasks.jobqueue import MAX_DELAY_SECONDS
from ..context import JobContext
from ..registry import job

#: A job delivered up to this many seconds before its time runs anyway (clocks of hosts differ a little).
EARLY_TOLERANCE = 1.0


@job("wait_and_resume", queue="scheduling", payload=WaitAndResume)
def wait_and_resume(payload: WaitAndResume, ctx: JobContext) -> None:
    ids = dict(queue=ctx.queue, job=ctx.job, job_id=ctx.job_id, attempt=ctx.attempt)
    with ctx.app.pool.connection() as conn, conn.transaction():
        # The row lock orders this against cancel_run: whichever commits first wins.
        row = conn.execute(QUERIES["pause_lock"], {"id": payload.pause_id}).fetchone()
        if row is None:
            log_event("skipped", **ids, pause_id=payload.pause_id, reason="pause no longer exists")
            return
        run_id, status, resume_job, resume_payload, resume_at = row
        if status != "waiting":
            reason = "the run was cancelled" if status == "cancelled" else "the run was already resumed"
            log_event("skipped", **ids, pause_id=payload.pause_id, run_id=run_id, reason=reason)
            return
        early = (resume_at - db_now(conn, None)).total_seconds()
        if early > EARLY_TOLERANCE:
            # Longer than the broker's delay window: sleep on in another hop.
            raise RetryLater(f"resumes at {resume_at.isoformat()}", delay=min(early, MAX_DELAY_SECONDS))
        try:
            ref = ctx.app.jobs.enqueue(resume_job, resume_payload, key=f"{resume_key(payload.pause_id)}:run")
        except (UnknownJob, InvalidPayload) as exc:
            raise PermanentError(f"cannot resume run {run_id}: {exc}") from None
        conn.execute(QUERIES["pause_resumed"], {"id": payload.pause_id, "job_id": ref.id})
    log_event("run_resumed", **ids, pause_id=payload.pause_id, run_id=run_id, resume_job=resume_job,
              resume_job_id=ref.id)
