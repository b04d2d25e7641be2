"""run.finalize: the end of a round fans out into its charge, memory extraction and indexing.

Each follow-up job is enqueued under its own key, so a finalize that runs
twice (a retry, a duplicate delivery, a duplicate enqueue) enqueues nothing
new; and each follow-up is idempotent on its own (the ledger's reference,
memory upserts, the indexed version), so even past the key's retention a
round is charged once.
"""

from __future__ import annotations

from conveyor.errors import PermanentError, RecordNotFound
from conveyor.logs import log_event
from conveyor.platform import records
from conveyor.platform.blueprint import jobs
from conveyor.platform.faults import maybe_fail
from conveyor.platform.payloads import CreditConsume, MemoryExtraction, ResourceIndex, RunFinalize
from conveyor.platform.queues import CRITICAL
from conveyor.tasks.context import JobContext
from conveyor.tasks.jobqueue import JobRequest


def round_resource_id(message_id: str) -> str:
    """The resource that makes a round's reply searchable."""
    return f"reply:{message_id}"


# On critical: a round's charge must not wait behind slow agent runs.
@jobs.job("run.finalize", queue=CRITICAL, payload=RunFinalize)
def finalize_run(payload: RunFinalize, ctx: JobContext) -> dict[str, int] | None:
    """Enqueue the round's charge, memory extraction and indexing; returns how many were new."""
    with ctx.app.pool.connection() as conn:
        try:
            run, task = records.run_of_task(conn, run_id=payload.run_id, task_id=payload.task_id)
        except RecordNotFound as exc:
            raise PermanentError(str(exc)) from None
        if run.status != "completed":
            # Nothing to charge or learn from a run that did not finish.
            log_event(
                "finalize_skipped",
                queue=ctx.queue,
                job=ctx.job,
                job_id=ctx.job_id,
                attempt=ctx.attempt,
                run_id=run.id,
                status=run.status,
            )
            return None
        reply = records.get_message(conn, run.assistant_message_id)
        resource_id = round_resource_id(reply.id)
        version = records.upsert_resource(
            conn, id=resource_id, user_id=task.user_id, task_id=task.id, title=task.title or task.id, body=reply.content
        )

    charge = CreditConsume(
        user_id=task.user_id, task_id=task.id, message_id=reply.id, total_tokens=run.total_tokens or 0
    )
    memory = MemoryExtraction(user_id=task.user_id, task_id=task.id, message_id=reply.id)
    index = ResourceIndex(resource_id=resource_id, version=version, user_id=task.user_id)
    refs = ctx.app.jobs.enqueue_many(
        [
            JobRequest("credit.consume", charge, key=charge.idempotency_key()),
            JobRequest("memory.extraction", memory, key=memory.idempotency_key()),
            JobRequest("resource.index", index, key=index.idempotency_key()),
        ]
    )
    maybe_fail(ctx, payload.idempotency_key(), "after enqueueing the round's jobs")
    with ctx.app.pool.connection() as conn:
        records.mark_finalized(conn, run.id)
    counts = {"enqueued": sum(not r.deduplicated for r in refs), "deduplicated": sum(r.deduplicated for r in refs)}
    log_event(
        "round_finalized",
        queue=ctx.queue,
        job=ctx.job,
        job_id=ctx.job_id,
        attempt=ctx.attempt,
        run_id=run.id,
        enqueued=counts["enqueued"],
        deduplicated=counts["deduplicated"],
    )
    return counts
