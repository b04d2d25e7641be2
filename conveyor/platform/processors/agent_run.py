"""task.run and chat.run: answer a round, streaming the reply to its readers.

Async jobs (``conveyor.tasks.aio``): a run awaits the model on the worker's
event loop and holds no thread while it waits, so a worker keeps its queue's
whole concurrency of runs in flight on a few threads. Its database and stream
writes are blocking calls (the psycopg pool, the Redis client): each runs in
the loop's thread pool (``asyncio.to_thread``), never on the loop. A time
limit or a cancel's interrupt cancels the coroutine at its ``await``; the
response is closed in its ``finally``.

Everything is rebuilt from the IDs in the payload. Each chunk goes into the
run's stream buffer under its seq before the next is generated; the
assistant message is written by the ID the run got at creation, with the
token usage, in the same transaction that completes the run; then the
end-of-round job (run.finalize) is enqueued under its key.

A re-run (retry, or a worker that died mid-stream) regenerates the reply
from the same conversation. The buffer ignores chunks it already holds,
so readers never see one twice; with the deterministic local provider the
regenerated chunks are the same ones. The stored message is what the
buffer holds, so it is always exactly what readers saw.

Fenced effects: each chunk is written only after ``ctx.check_fence()``, so a
delivery whose worker was paused past its lease stops streaming when it
resumes; the reply and the run's completion are written once whichever
delivery gets there first (``complete_run`` moves only a live run, the
once-guard of that write).
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any, cast

from conveyor.errors import PermanentError, RecordNotFound
from conveyor.logs import log_event
from conveyor.platform import records
from conveyor.platform.blueprint import jobs
from conveyor.platform.faults import maybe_fail_mid_stream
from conveyor.platform.payloads import ChatRun, RunFinalize, TaskRun, run_key
from conveyor.platform.providers import ChatMessage, provider_for
from conveyor.platform.providers.base import Role, Usage, estimate_usage
from conveyor.platform.queues import AGENT
from conveyor.platform.streams import buffer_for
from conveyor.platform.streams.base import StreamBuffer
from conveyor.tasks.context import JobContext

if TYPE_CHECKING:
    from psycopg import Connection

#: What task.run tells the model before the task's own instructions.
TASK_PREAMBLE = "You are an agent carrying out a task for the user."


@jobs.job("task.run", queue=AGENT, payload=TaskRun)
async def task_run(payload: TaskRun, ctx: JobContext) -> None:
    """A task round: the task's instructions and the user's latest message."""
    await run_round(payload, ctx, whole_conversation=False)


@jobs.job("chat.run", queue=AGENT, payload=ChatRun)
async def chat_run(payload: ChatRun, ctx: JobContext) -> None:
    """A chat round: the whole conversation up to the user's message."""
    await run_round(payload, ctx, whole_conversation=True)


async def run_round(payload: TaskRun, ctx: JobContext, *, whole_conversation: bool) -> None:
    buffer = buffer_for(ctx.app)
    started = await asyncio.to_thread(_start, payload, ctx, buffer, whole_conversation)
    if started is None:
        return
    run, messages = started
    generation = provider_for(ctx.app).stream(messages)
    seq = 0
    try:
        async for text in generation:
            if ctx.cancelled:
                break  # the user pressed Stop: the cancel hook keeps what was streamed (run_cancelled)
            seq += 1
            await asyncio.to_thread(_stream_chunk, ctx, buffer, run.id, seq, text)
    finally:
        await generation.aclose()
    if ctx.cancelled:
        return
    await asyncio.to_thread(_complete, ctx, buffer, run, messages, generation.usage)


def _start(
    payload: TaskRun, ctx: JobContext, buffer: StreamBuffer, whole_conversation: bool
) -> tuple[records.Run, list[ChatMessage]] | None:
    """Move the run to ``running`` and read its conversation; None when there is nothing to generate."""
    with ctx.app.pool.connection() as conn:
        try:
            run, task = records.run_of_task(conn, run_id=payload.run_id, task_id=payload.task_id)
        except RecordNotFound as exc:
            raise PermanentError(str(exc)) from None
        if run.terminal:
            # An earlier attempt finished it; make sure its stream ended and its round was finalized.
            if run.status == "completed":
                buffer.end(run.id, "completed")
                _enqueue_finalize(ctx, run)
            return None
        if records.start_run(conn, run.id) is None:
            return None  # another attempt ended it between our read and now; it finalizes its own round
        return run, _context(conn, task, run, whole_conversation)


def _stream_chunk(ctx: JobContext, buffer: StreamBuffer, run_id: str, seq: int, text: str) -> None:
    # A delivery given up on (its worker paused past the lease) stops streaming: another
    # one owns the run, and a stale stream could outlast the stored reply.
    ctx.check_fence()
    buffer.append(run_id, seq, text)
    maybe_fail_mid_stream(ctx, run_key(run_id), seq)


def _complete(
    ctx: JobContext, buffer: StreamBuffer, run: records.Run, messages: list[ChatMessage], reported: Usage | None
) -> None:
    """Store the reply the buffer holds (what readers saw), end the stream, enqueue the round's end."""
    streamed = [e for e in buffer.read_all(run.id) if e.kind == "chunk"]
    content = "".join(e.data for e in streamed)
    usage = reported or estimate_usage(messages, content)
    with ctx.app.pool.connection() as conn:
        completed = records.complete_run(
            conn, run, content=content, prompt_tokens=usage.prompt_tokens, completion_tokens=usage.completion_tokens
        )
    buffer.end(run.id, "completed")
    log_event(
        "run_completed" if completed else "run_already_completed",
        queue=ctx.queue,
        job=ctx.job,
        job_id=ctx.job_id,
        attempt=ctx.attempt,
        run_id=run.id,
        chunks=len(streamed),
        total_tokens=usage.total_tokens,
    )
    _enqueue_finalize(ctx, run)


def _context(
    conn: Connection[Any], task: records.Task, run: records.Run, whole_conversation: bool
) -> list[ChatMessage]:
    system = f"{TASK_PREAMBLE}\n{task.instructions}".strip() if task.kind == "task" else task.instructions
    messages = [ChatMessage("system", system)] if system else []
    if whole_conversation:
        # The messages table's CHECK admits only the three roles a provider knows.
        conversation = records.conversation(conn, run.user_message_id)
        messages += [ChatMessage(cast(Role, role), content) for role, content in conversation]
    else:
        messages.append(ChatMessage("user", records.get_message(conn, run.user_message_id).content))
    return messages


def _enqueue_finalize(ctx: JobContext, run: records.Run) -> None:
    payload = RunFinalize(task_id=run.task_id, run_id=run.id)
    ctx.app.jobs.enqueue("run.finalize", payload, key=payload.idempotency_key())


@jobs.on_final_failure("task.run")
@jobs.on_final_failure("chat.run")
def run_failed(payload: TaskRun | None, error: str, ctx: JobContext) -> None:
    """A run that spent its attempts ends ``failed``, and so does its stream: no reader waits forever."""
    if payload is None:
        return
    with ctx.app.pool.connection() as conn:
        records.fail_run(conn, payload.run_id, error)
    buffer_for(ctx.app).end(payload.run_id, "failed")


@jobs.on_cancel("task.run")
@jobs.on_cancel("chat.run")
def run_cancelled(payload: TaskRun | None, ctx: JobContext) -> None:
    """A run stopped by its user ends ``cancelled`` with the reply streamed so far, and its stream ends with a
    ``cancelled`` event (what was streamed stays readable)."""
    if payload is None:
        return
    buffer = buffer_for(ctx.app)
    partial = "".join(e.data for e in buffer.read_all(payload.run_id) if e.kind == "chunk")
    with ctx.app.pool.connection() as conn:
        run, _ = records.run_of_task(conn, run_id=payload.run_id, task_id=payload.task_id)
        records.cancel_run(conn, run, running=True, partial=partial)
    buffer.end(payload.run_id, "cancelled")
    log_event(
        "run_cancelled", queue=ctx.queue, job=ctx.job, job_id=ctx.job_id, attempt=ctx.attempt, run_id=payload.run_id
    )
