"""wait_and_resume: resume a paused run by enqueueing its resume job, unless the run was cancelled."""

from __future__ import annotations

from typing import Any

from conveyor.logs import log_event
from conveyor.platform.blueprint import jobs
from conveyor.platform.queues import SCHEDULING
from conveyor.platform.records import TERMINAL
from conveyor.platform.scheduling import pauses
from conveyor.platform.scheduling.followups import defer_if_early, enqueue_follow_up
from conveyor.platform.scheduling.payloads import WaitAndResume
from conveyor.tasks.context import JobContext


@jobs.job("wait_and_resume", queue=SCHEDULING, payload=WaitAndResume)
def wait_and_resume(payload: WaitAndResume, ctx: JobContext) -> None:
    ids: dict[str, Any] = dict(queue=ctx.queue, job=ctx.job, job_id=ctx.job_id, attempt=ctx.attempt)
    with ctx.app.pool.connection() as conn, conn.transaction():
        # The row lock orders this against cancel_run: whichever commits first wins.
        pause = pauses.lock_pause(conn, payload.pause_id)
        if pause is None:
            log_event("skipped", **ids, pause_id=payload.pause_id, reason="pause no longer exists")
            return
        run_id = pause.run_id
        if pause.status != "waiting":
            reason = "the run was cancelled" if pause.status == "cancelled" else "the run was already resumed"
            log_event("skipped", **ids, pause_id=payload.pause_id, run_id=run_id, reason=reason)
            return
        if pause.run_status in TERMINAL:
            # Ended on the platform's side (cancelled there, say) without cancel_run: nothing to resume.
            pauses.mark_cancelled(conn, payload.pause_id)
            log_event(
                "skipped",
                **ids,
                pause_id=payload.pause_id,
                run_id=run_id,
                reason="the run was cancelled"
                if pause.run_status == "cancelled"
                else f"the run already {pause.run_status}",
            )
            return
        defer_if_early(conn, pause.resume_at, f"run {run_id}'s resume")
        ref = enqueue_follow_up(
            ctx.app,
            pause.resume_job,
            pause.resume_payload,
            f"{pauses.resume_key(payload.pause_id)}:run",
            f"resume run {run_id}",
        )
        pauses.mark_resumed(conn, payload.pause_id, ref.id)
    log_event(
        "run_resumed",
        **ids,
        pause_id=payload.pause_id,
        run_id=run_id,
        resume_job=pause.resume_job,
        resume_job_id=ref.id,
    )
