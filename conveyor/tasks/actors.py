"""One Dramatiq actor per job type: thin, it rebuilds the payload and calls the processor."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, Callable

import dramatiq
from dramatiq.middleware import CurrentMessage
from pydantic import ValidationError

from conveyor.blueprints import JobType
from conveyor.budgets import admit
from conveyor.errors import MalformedMessage
from conveyor.results import store_result
from conveyor.tasks import aio
from conveyor.tasks.context import JobContext
from conveyor.tasks.payloads import Payload

if TYPE_CHECKING:
    from conveyor.app import App


def declare_actors(broker: dramatiq.Broker, app: "App") -> None:
    """Declare every job type of ``app`` as an actor on ``broker``, with its queue's settings."""
    for job_type in app.job_types.values():
        queue = app.queues[job_type.queue]
        actor = dramatiq.Actor(
            _runner(job_type, app),
            broker=broker,
            actor_name=job_type.name,
            queue_name=job_type.queue,
            priority=0,
            options={
                "time_limit": int((job_type.time_limit or queue.time_limit) * 1000),
                "max_attempts": app.max_attempts(job_type),
                "min_backoff": queue.min_backoff,
                "max_backoff": queue.max_backoff,
            },
        )
        # Dramatiq's actor logs its arguments (the payload, secrets included) at DEBUG:
        # never let that line out, whatever the log level.
        actor.logger.setLevel(logging.INFO)


def load_payload(job_type: JobType, data: Any) -> Payload:
    """The message's payload as its model; a payload that no longer validates is a permanent failure."""
    try:
        return job_type.payload.load(data)
    except ValidationError as exc:
        fields = "; ".join(f"{'.'.join(map(str, e['loc'])) or '<payload>'}: {e['msg']}" for e in exc.errors())
        raise MalformedMessage(f"payload of {job_type.name!r} does not validate: {fields}") from None


def _runner(job_type: JobType, app: "App") -> Callable[..., aio.Released | None]:
    def run(data: Any = None, *args: Any, **kwargs: Any) -> aio.Released | None:
        message = CurrentMessage.get_current_message()
        if args or kwargs:
            raise MalformedMessage(f"message for {job_type.name!r} has unexpected arguments")
        payload = load_payload(job_type, data)
        attempt = message.options.get("attempt", 1) if message else 1
        ctx = JobContext(
            job=job_type.name,
            queue=job_type.queue,
            job_id=message.message_id if message else "",
            attempt=attempt,
            max_attempts=app.max_attempts(job_type),
            app=app,
            delivery=app.broker.delivery(message) if message else None,
            message=message,
            payload=payload,
        )
        # Before the body: a job its budgets have no room for waits (RetryLater), having done nothing.
        admit(ctx, payload, ctx.budgets)

        def finish(value: Any) -> None:
            if job_type.store_result:
                # Before the ack: a store that fails fails this attempt, which is retried.
                store_result(app, job_type, ctx.job_id, value)

        if aio.is_async(job_type.run):
            if aio.releases_here():
                # Conveyor's worker thread starts it on the loop and goes on; a finisher thread calls
                # finish(value) when it ends, then the after_process_message chain and the ack.
                return aio.Released(app, job_type.run(payload, ctx), finish)
            # Elsewhere this thread waits on the loop, and a time limit raised in it cancels the coroutine.
            value = aio.run_async(app, job_type.run(payload, ctx))
        else:
            value = job_type.run(payload, ctx)
        finish(value)
        # Kept only by store_result: Dramatiq would warn of a value no Results middleware takes.
        return None

    run.__name__ = job_type.name.replace(".", "_")
    run.__module__ = job_type.run.__module__
    return run
