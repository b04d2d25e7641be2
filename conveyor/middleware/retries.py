"""Attempts, retries with backoff, and the one final failure of a job.

Replaces Dramatiq's ``Retries``: attempts are counted by the broker on
every start (so a job whose worker dies counts too, which Dramatiq's
redelivery does not), permanent errors fail at once, and when a job has
spent its attempts its final-failure hooks run.

An outage is not the job's fault: a body that met one of conveyor's own
servers away (:class:`~conveyor.errors.StoreUnavailable`: the broker during a
failover, the ledger's Postgres restarting) is retried with the queue's
backoff without spending an attempt, up to ``CONVEYOR_OUTAGE_RETRIES``
times per job, so a restart longer than the attempts' backoff fails no job
for good (the campaign's soak found both: five attempts spent on
``DatabaseUnavailable``, and on ``BrokerUnreachable`` in ``ctx.wait_for``).

Hooks are durable and at least once: the broker's claim names the delivery
and keeps the job held, the nack after the hooks marks them done. A worker
that dies in a hook leaves the claim behind; recovery hands the job out
again as a finalize delivery (``FINALIZE``), which runs the hooks only,
never the body.
"""

from __future__ import annotations

from typing import Any

from dramatiq import Broker
from dramatiq.broker import MessageProxy
from dramatiq.common import compute_backoff
from dramatiq.middleware import SkipMessage
from pydantic import ValidationError

from conveyor.brokers.base import CANCELLED, CANCELLED_AT_START, FINALIZE, AnyMessage, FinalFailure
from conveyor.errors import PermanentError, RetryLater, StoreUnavailable, WaitForEvent, describe_error
from conveyor.events import PARK, WAITED_FOR
from conveyor.logs import log_event, log_job_error
from conveyor.middleware.base import ConveyorMiddleware, conveyor_broker

#: Errors that can never succeed on a second try.
PERMANENT = (PermanentError, ValidationError)


class WorkerLost(Exception):
    """The job's earlier deliveries never finished: their worker died."""


class Retries(ConveyorMiddleware):
    """Counts attempts and decides, after each failure, between retry and final failure."""

    def __init__(self, on_final_failure: FinalFailure, *, outage_retries: int = 20) -> None:
        #: Called as ``on_final_failure(broker, message, error_text)`` once per job.
        self.on_final_failure = on_final_failure
        #: Retries per job that an outage (StoreUnavailable) does not count as attempts.
        self.outage_retries = outage_retries

    @property
    def actor_options(self) -> set[str]:
        return {"max_attempts", "min_backoff", "max_backoff"}

    def before_process_message(self, broker: Broker, message: MessageProxy) -> None:
        if message.options.get(FINALIZE):
            self._finalize(broker, message)
            raise SkipMessage("failed for good earlier: only its final-failure hooks ran")
        attempt = conveyor_broker(broker).start_job(message)
        if attempt == 0:
            log_event(
                "skipped",
                queue=message.queue_name,
                job=message.actor_name,
                job_id=message.message_id,
                attempt=None,
                reason="job was deleted",
            )
            raise SkipMessage("job was deleted")
        if attempt == CANCELLED_AT_START:
            log_event(
                "cancelled",
                queue=message.queue_name,
                job=message.actor_name,
                job_id=message.message_id,
                attempt=None,
                reason="cancelled before it started: never run",
            )
            raise SkipMessage("job was cancelled")
        message.options["attempt"] = attempt
        budget = self._max_attempts(broker, message) + message.options.get("deferrals", 0)
        if attempt > budget:
            error = WorkerLost(f"the worker died during each of the {attempt - 1} earlier attempts")
            try:
                self._fail(broker, message, describe_error(error))
            except Exception as exc:
                # Whatever the claim raised, the body must not run: raising it here would be swallowed
                # by Dramatiq and the spent job would run again. The broker left the job unsettled
                # (its claim says so), so it comes back and claims again.
                _claim_failed(message, exc)
            raise SkipMessage(str(error))

    def after_process_message(
        self, broker: Broker, message: MessageProxy, *, result: Any = None, exception: BaseException | None = None
    ) -> None:
        if exception is None or message.options.get(CANCELLED):
            return  # a cancelled job is neither retried nor failed (conveyor.middleware.cancel)
        attempt = message.options.get("attempt", 1)
        error = describe_error(exception)
        if isinstance(exception, WaitForEvent):
            # Parked (ctx.wait_for): no attempt spent, like RetryLater; the broker's retry of this delivery
            # parks the job awaiting the event (or resolves it at once from a kept signal).
            deferrals = message.options.get("deferrals", 0) + 1
            log_event(
                "awaiting",
                queue=message.queue_name,
                job=message.actor_name,
                job_id=message.message_id,
                attempt=attempt,
                awaited=exception.name,
                timeout_s=exception.timeout,
            )
            options = {"deferrals": deferrals, WAITED_FOR: exception.name, PARK: exception.name}
            broker.enqueue(message.copy(options=options), delay=max(1, int(exception.timeout * 1000)))
            return
        if isinstance(exception, RetryLater):
            delay = int(exception.delay * 1000)
            deferrals = message.options.get("deferrals", 0) + 1
            log_event(
                "retry",
                queue=message.queue_name,
                job=message.actor_name,
                job_id=message.message_id,
                attempt=attempt,
                delay_ms=delay,
                reason=error,
            )
            broker.enqueue(message.copy(options={"deferrals": deferrals, "last_error": error}), delay=delay)
            return
        if isinstance(exception, PERMANENT):
            self._fail(broker, message, error)
            return
        outages = message.options.get("outages", 0)
        if isinstance(exception, StoreUnavailable) and outages < self.outage_retries:
            delay = self._backoff(broker, message, outages + 1)
            log_event(
                "retry",
                level="warning",
                queue=message.queue_name,
                job=message.actor_name,
                job_id=message.message_id,
                attempt=attempt,
                delay_ms=delay,
                error=error,
                reason="a server was away: no attempt spent",
            )
            options = {"deferrals": message.options.get("deferrals", 0) + 1, "outages": outages + 1}
            broker.enqueue(message.copy(options={**options, "last_error": error}), delay=delay)
            return
        budget = self._max_attempts(broker, message) + message.options.get("deferrals", 0)
        if attempt >= budget:
            self._fail(broker, message, error)
            return
        delay = self._backoff(broker, message, attempt)
        log_event(
            "retry",
            level="warning",
            queue=message.queue_name,
            job=message.actor_name,
            job_id=message.message_id,
            attempt=attempt,
            delay_ms=delay,
            error=error,
        )
        broker.enqueue(message.copy(options={"last_error": error}), delay=delay)

    def _backoff(self, broker: Broker, message: AnyMessage, tries: int) -> int:
        """Milliseconds before the next try: exponential in ``tries``, jittered up to 2x, within the queue's bounds."""
        actor = broker.get_actor(message.actor_name)
        min_ms = int(actor.options["min_backoff"] * 1000)
        max_ms = int(actor.options["max_backoff"] * 1000)
        _, delay = compute_backoff(tries - 1, factor=max(min_ms, 1), max_backoff=max(max_ms, min_ms, 1))
        return int(delay)

    def _max_attempts(self, broker: Broker, message: AnyMessage) -> int:
        # declare_actors sets every actor's max_attempts (JobType.attempts).
        attempts: int = broker.get_actor(message.actor_name).options["max_attempts"]
        return attempts

    def _finalize(self, broker: Broker, message: MessageProxy) -> None:
        """A finalize delivery: run the hooks a dead worker claimed and never marked done.

        Counts no attempt and never raises (Dramatiq would swallow it and run
        the body): an error text that cannot be read is named as such.
        """
        conveyor = conveyor_broker(broker)
        error = None
        try:
            record = conveyor.get_job(message.message_id)
            error = record.error if record else None
            message.options["attempt"] = record.attempts if record else 0
        except Exception as exc:
            error = f"(the job's error could not be read: {type(exc).__name__})"
        error = error or "failed"
        log_event(
            "hooks_resumed",
            level="warning",
            queue=message.queue_name,
            job=message.actor_name,
            job_id=message.message_id,
            attempt=message.options.get("attempt"),
            reason="the worker running its final-failure hooks died: they run again",
        )
        message.fail()
        message.options["last_error"] = error
        try:
            claimed = conveyor.claim_final_failure(message)
        except Exception as exc:  # the broker handed the job back (its nack does that): it comes again
            _claim_failed(message, exc)
            return
        if claimed:
            self.on_final_failure(conveyor, message, error)

    def _fail(self, broker: Broker, message: MessageProxy, error: str) -> None:
        message.fail()
        message.options["last_error"] = error
        log_event(
            "failed",
            level="error",
            queue=message.queue_name,
            job=message.actor_name,
            job_id=message.message_id,
            attempt=message.options.get("attempt"),
            error=error,
        )
        conveyor = conveyor_broker(broker)
        if conveyor.claim_final_failure(message):
            self.on_final_failure(conveyor, message, error)


def _claim_failed(message: MessageProxy, exc: Exception) -> None:
    log_job_error(message, f"final-failure claim failed: {type(exc).__name__}")
