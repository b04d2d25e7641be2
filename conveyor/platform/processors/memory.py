"""memory.extraction: learn durable facts about the user from one round, and upsert them.

Runs on the llm queue under two fleet-wide limits, both over the broker's
own store: at most ``CONVEYOR_LLM_GLOBAL_CONCURRENCY`` extractions run at
once across every worker, and the provider gets at most
``CONVEYOR_PROVIDER_RATE_LIMIT`` requests per ``CONVEYOR_PROVIDER_RATE_WINDOW``
(a library :class:`~conveyor.budgets.Budget`, a sliding window).
A job that finds either exhausted is delayed (``RetryLater``): it does not
fail and does not spend an attempt.

The memories of one round are written once (``ctx.once``): a model asked
twice answers differently, and two deliveries of the job would otherwise
leave the union of both answers.

An async job (``conveyor.tasks.aio``): it awaits the model on the worker's
event loop, holding no thread; the slot, the budget and the database calls
are blocking and run in the loop's thread pool (``asyncio.to_thread``).
"""

from __future__ import annotations

import asyncio
import random
import re
from datetime import datetime

from conveyor.budgets import Budget, admit
from conveyor.errors import PermanentError, RecordNotFound, RetryLater
from conveyor.logs import log_event
from conveyor.platform import records
from conveyor.platform.blueprint import jobs
from conveyor.platform.faults import maybe_fail
from conveyor.platform.limits import limits_for
from conveyor.platform.payloads import MemoryExtraction
from conveyor.platform.providers import ChatMessage, Completion, provider_for
from conveyor.platform.queues import LLM
from conveyor.platform.settings import platform_settings
from conveyor.tasks.context import JobContext

#: The semaphore every llm-queue job shares.
LLM_SLOTS = "queue:llm"

#: The budget of provider requests (CONVEYOR_PROVIDER_RATE_LIMIT per CONVEYOR_PROVIDER_RATE_WINDOW).
PROVIDER_REQUESTS = "provider-requests"

#: A job that found no free slot tries again after this many seconds (jittered up to 2x,
#: so waiting jobs do not all come back at once). Extractions take seconds, not minutes.
SLOT_RETRY_DELAY = 0.5

#: Memories kept per round; a model that rambles does not flood the table.
MAX_MEMORIES = 10

EXTRACTION_PROMPT = (
    "From the conversation below, list durable facts about the user worth remembering in later "
    "conversations. One per line, as `topic: fact`, at most {n} lines, nothing else."
)


@jobs.job("memory.extraction", queue=LLM, payload=MemoryExtraction)
async def extract_memories(payload: MemoryExtraction, ctx: JobContext) -> None:
    app = ctx.app
    limits = limits_for(app)
    config = platform_settings(app)
    async with limits.semaphore.held_async(LLM_SLOTS, config.llm_global_concurrency) as slot:
        if slot is None:
            raise RetryLater("every llm slot is taken fleet-wide", delay=SLOT_RETRY_DELAY * (1 + random.random()))
        if config.provider_rate_limit:
            # Its limit is a setting, so the budget is built here rather than declared on the queue.
            requests = Budget(PROVIDER_REQUESTS, limit=config.provider_rate_limit, per=config.provider_rate_window)
            await asyncio.to_thread(admit, ctx, payload, [requests])
        await _extract(payload, ctx)


async def _extract(payload: MemoryExtraction, ctx: JobContext) -> None:
    started_at, question, answer = await asyncio.to_thread(_round, payload, ctx)
    completion = await provider_for(ctx.app).complete(
        [
            ChatMessage("system", EXTRACTION_PROMPT.format(n=MAX_MEMORIES)),
            ChatMessage("user", question),
            ChatMessage("assistant", answer),
        ]
    )
    maybe_fail(ctx, f"memory:{payload.message_id}", "after the provider answered")
    await asyncio.to_thread(_store, payload, ctx, parse_memories(completion.text), started_at, completion)


def _round(payload: MemoryExtraction, ctx: JobContext) -> tuple[datetime, str, str]:
    """The database's clock now (the extraction's start) and the round's question and answer."""
    with ctx.app.pool.connection() as conn:
        started_at = records.clock(conn)
        try:
            _run_id, question, answer = records.round_of(conn, task_id=payload.task_id, message_id=payload.message_id)
        except RecordNotFound as exc:
            raise PermanentError(str(exc)) from None
    return started_at, question, answer


def _store(
    payload: MemoryExtraction, ctx: JobContext, found: dict[str, str], started_at: datetime, completion: Completion
) -> None:
    with ctx.app.pool.connection() as conn, conn.transaction():
        # Once per job: a second delivery (a paused worker resuming after another one finished, a
        # retry after a lost ack) would merge its own, different answer into the user's memories.
        if not ctx.once(conn, "memories"):
            log_event(
                "memories_already_extracted",
                queue=ctx.queue,
                job=ctx.job,
                job_id=ctx.job_id,
                attempt=ctx.attempt,
                message_id=payload.message_id,
            )
            return
        for key, value in found.items():
            records.upsert_memory(
                conn,
                user_id=payload.user_id,
                key=key,
                value=value,
                task_id=payload.task_id,
                message_id=payload.message_id,
            )
        records.record_extraction(
            conn,
            user_id=payload.user_id,
            task_id=payload.task_id,
            message_id=payload.message_id,
            memories=len(found),
            started_at=started_at,
        )
    log_event(
        "memories_extracted",
        queue=ctx.queue,
        job=ctx.job,
        job_id=ctx.job_id,
        attempt=ctx.attempt,
        message_id=payload.message_id,
        memories=len(found),
        total_tokens=completion.usage.total_tokens,
    )


def parse_memories(text: str) -> dict[str, str]:
    """``topic: fact`` lines as {key: fact}; keys are lower-case slugs, later lines win, others are ignored."""
    found: dict[str, str] = {}
    for line in text.splitlines():
        topic, sep, fact = line.strip().lstrip("-*• ").partition(":")
        key = re.sub(r"[^a-z0-9]+", "-", topic.lower()).strip("-")[:100]
        if sep and key and fact.strip():
            found[key] = fact.strip()[:2000]
        if len(found) >= MAX_MEMORIES:
            break
    return found
