"""credit.consume: charge the tokens of one round, exactly once however often it runs."""

from __future__ import annotations

from conveyor.ledger import credits
from conveyor.logs import log_event
from conveyor.middleware.metrics import record_ledger_consumption
from conveyor.platform.blueprint import jobs
from conveyor.platform.payloads import CreditConsume
from conveyor.platform.queues import CRITICAL
from conveyor.tasks.context import JobContext


@jobs.job("credit.consume", queue=CRITICAL, payload=CreditConsume)
def consume_credits(payload: CreditConsume, ctx: JobContext) -> None:
    with ctx.app.pool.connection() as conn:
        result = credits.consume(
            conn,
            user_id=payload.user_id,
            task_id=payload.task_id,
            message_id=payload.message_id,
            total_tokens=payload.total_tokens,
            price_per_1k=ctx.app.settings.price_per_1k_tokens,
        )
    record_ledger_consumption(ctx, result.applied)
    if not result.applied:
        log_event(
            "ledger_duplicate",
            queue=ctx.queue,
            job=ctx.job,
            job_id=ctx.job_id,
            attempt=ctx.attempt,
            reference=credits.consume_reference(payload.task_id, payload.message_id),
        )
