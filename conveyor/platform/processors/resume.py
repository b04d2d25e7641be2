"""wait_and_resume: resume a paused run by enqueueing its resume job, unless the run was cancelled."""

from __future__ import annotations

from conveyor.logs import log_event
from conveyor.platform.queues import SCHEDULING
from conveyor.platform.records import TERMINAL
from conveyor.platform.scheduling.followups import defer_if_early, enqueue_follow_up
from conveyor.platform.scheduling.pauses import resume_key
from conveyor.platform.scheduling.payloads import WaitAndResume
from conveyor.platform.scheduling.schedules import QUERIES
from conveyor.tasks.context import JobContext
from conveyor.tasks.registry import job

#: Statuses of the platform's runs (table runs) after which a pause is not resumed: the terminal ones.
ENDED = TERMINAL


@job("wait_and_resume", queue=SCHEDULING, payload=WaitAndResume)
def wait_and_resume(payload: WaitAndResume, ctx: JobContext) -> None:
    ids = dict(queue=ctx.queue, job=ctx.job, job_id=ctx.job_id, attempt=ctx.attempt)
    with ctx.app.pool.connection() as conn, conn.transaction():
        # The row lock orders this against cancel_run: whichever commits first wins.
        row = conn.execute(QUERIES["pause_lock"], {"id": payload.pause_id}).fetchone()
        if row is None:
            log_event("skipped", **ids, pause_id=payload.pause_id, reason="pause no longer exists")
            return
        run_id, status, resume_job, resume_payload, resume_at, run_status = row
        if status != "waiting":
            reason = "the run was cancelled" if status == "cancelled" else "the run was already resumed"
            log_event("skipped", **ids, pause_id=payload.pause_id, run_id=run_id, reason=reason)
            return
        if run_status in ENDED:
            # Ended on the platform's side (cancelled there, say) without cancel_run: nothing to resume.
            conn.execute(QUERIES["pause_cancel"], {"id": payload.pause_id})
            log_event(
                "skipped",
                **ids,
                pause_id=payload.pause_id,
                run_id=run_id,
                reason="the run was cancelled" if run_status == "cancelled" else f"the run already {run_status}",
            )
            return
        defer_if_early(conn, resume_at, f"run {run_id}'s resume")
        ref = enqueue_follow_up(
            ctx.app, resume_job, resume_payload, f"{resume_key(payload.pause_id)}:run", f"resume run {run_id}"
        )
        conn.execute(QUERIES["pause_resumed"], {"id": payload.pause_id, "job_id": ref.id})
    log_event(
        "run_resumed", **ids, pause_id=payload.pause_id, run_id=run_id, resume_job=resume_job, resume_job_id=ref.id
    )
