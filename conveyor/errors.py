"""The one error tree. Library errors are translated where they enter."""

from __future__ import annotations

from typing import TypedDict


class ConveyorError(Exception):
    """Root of every error conveyor raises on purpose."""


def describe_error(exc: BaseException, limit: int = 2000) -> str:
    """A short, one-line description of an error for job records and logs."""
    text = f"{type(exc).__name__}: {exc}".replace("\n", " ")
    return text[:limit]


class ConfigurationError(ConveyorError):
    """The settings or the environment cannot work as given."""


class JobModuleNotFound(ConfigurationError):
    """A module named in ``CONVEYOR_IMPORTS`` could not be imported from the paths searched (``--path``)."""


class ResultError(ConveyorError):
    """A job's stored result could not be had (``handle.result()``, ``app.jobs.result()``)."""


class JobFailed(ResultError):
    """The job failed for good; ``error`` is its last error, scrubbed of secret values."""

    def __init__(self, job: str, job_id: str, error: str) -> None:
        super().__init__(f"job {job!r} ({job_id}) failed for good: {error}")
        self.job, self.job_id, self.error = job, job_id, error


class ResultTimeout(ResultError):
    """The job had no result within the wait; it may still finish (wait again with the same id)."""


class ResultNotStored(ResultError):
    """The job's type does not keep results: register it with ``store_result=True``."""


class StoreUnavailable(ConveyorError):
    """A backing store (Redis, Postgres) could not be reached or did not answer in time; a retry may succeed.

    The base of every "a server is away" error (:class:`BrokerUnavailable`,
    :class:`BrokerUnreachable`, :class:`DatabaseUnavailable`), so a caller
    (the HTTP side: 503) handles it once, whichever server it was.
    """


class StoreRefused(ConveyorError):
    """A backing store answered with an error a retry cannot fix (a constraint, data it cannot store, a bug).

    The base of every "the server refused" error (:class:`DatabaseRefused`, :class:`BrokerRejected`).
    """


# -- enqueueing ---------------------------------------------------------------


class EnqueueError(ConveyorError):
    """A job could not be enqueued; nothing was enqueued (but see :class:`EnqueueOutcomeUnknown`)."""


class UnknownJob(EnqueueError):
    """No job type has this name."""

    def __init__(self, job: str, known: list[str]) -> None:
        super().__init__(f"unknown job {job!r}; known jobs: {', '.join(sorted(known))}")
        self.job = job


class FieldError(TypedDict):
    """One field's problem, as pydantic reports it: where (``loc``, the path into the payload) and what."""

    loc: tuple[str | int, ...]
    msg: str


class InvalidPayload(EnqueueError):
    """The payload does not match its job's model. ``errors`` lists each field."""

    def __init__(self, job: str, errors: list[FieldError]) -> None:
        fields = "; ".join(
            f"{'.'.join(str(p) for p in err.get('loc', ())) or '<payload>'}: {err.get('msg')}" for err in errors
        )
        super().__init__(f"invalid payload for job {job!r}: {fields}")
        self.job = job
        self.errors = errors


class PayloadTooLarge(EnqueueError):
    """The encoded payload is larger than ``CONVEYOR_MAX_PAYLOAD_BYTES``."""


class BrokerUnavailable(StoreUnavailable, EnqueueError):
    """The broker could not be reached, or refused before writing; the job was not enqueued and its key is free."""


class TransactionalEnqueueUnsupported(EnqueueError):
    """``connection=`` was given but the broker keeps jobs outside Postgres (only the postgres broker can)."""


# -- running ------------------------------------------------------------------


class JobError(ConveyorError):
    """Raised by a processor: the job failed and may be retried."""


class PermanentError(JobError):
    """The job can never succeed (bad input, missing target): fail it at once, no retry."""


class RetryLater(ConveyorError):
    """Not a failure: run the job again after ``delay`` seconds (a rate limit, say).

    It does not spend an attempt's worth of backoff and is never logged as an error.
    Outside :class:`JobError` on purpose: ``except JobError`` means "this attempt failed".
    """

    def __init__(self, message: str = "retry later", *, delay: float) -> None:
        super().__init__(message)
        self.delay = delay


class BudgetThrottled(RetryLater):
    """A job's budget (``conveyor.budgets``) has no room for it now: it runs again once the window has."""


class WaitForEvent(RetryLater):
    """Not a failure: the job waits for the event ``name`` (``ctx.wait_for``), holding no thread.

    The attempt ends here without spending one; the job is parked ("awaiting") until a signal of
    ``name`` or ``timeout`` seconds, then runs again from the top and ``ctx.wait_for`` returns at once.
    """

    def __init__(self, name: str, *, timeout: float) -> None:
        super().__init__(f"waiting for event {name}", delay=timeout)
        self.name = name
        self.timeout = timeout


class BudgetUnknown(PermanentError):
    """``ctx.spend`` named a budget its job does not have (a mistake in the job's code)."""


class EffectError(ConveyorError):
    """A job's own effect could not be fenced or guarded as asked (``ctx.check_fence``, ``ctx.once``,
    ``ctx.transaction``). Not a :class:`JobError`: a stale delivery that raises one has not failed, another
    delivery owns the job."""


class DeliveryFenced(EffectError):
    """This delivery is no longer its job's current one: its worker was paused or cut off past the lease
    and the job was handed to another delivery (or it ended). Its effects must not apply: raised inside a
    transaction, the transaction rolls back. The broker ignores the stale delivery's outcome."""


class NoDelivery(EffectError):
    """The context has no delivery to fence (a final-failure hook runs after the job's last delivery)."""


class TransactionalCompletionUnsupported(EffectError):
    """``ctx.transaction()`` / ``ctx.complete_in(conn)`` need the postgres broker: only there is the job a row
    that the caller's transaction can complete (``ctx.once`` works on every broker)."""


class NotInTransaction(EffectError):
    """``ctx.once`` / ``ctx.complete_in`` were given a connection with no open transaction: the record and the
    effect would not commit together."""


class MalformedMessage(PermanentError):
    """A message in a queue could not be decoded or its payload no longer validates."""


# -- schedules and secrets ----------------------------------------------------


class ScheduleError(ConveyorError):
    """A schedule, a pause or a nudge could not be created or changed."""


class InvalidSchedule(ScheduleError):
    """A bad name, cron expression, time zone, misfire policy, job or payload; nothing was created or changed."""


class ScheduleNotFound(ScheduleError):
    """No schedule has this id (the platform's) or name (app.cron's)."""


class SecretKeyError(ConfigurationError):
    """``CONVEYOR_SECRET_KEY`` is missing where secrets must be encrypted, or is not a Fernet key."""


# -- ledger -------------------------------------------------------------------


class LedgerError(ConveyorError):
    """The credit ledger refused an operation."""


class UnknownAccount(LedgerError):
    """No account exists for this user."""


# -- operating (admin API and dashboard) ---------------------------------------


class AdminError(ConveyorError):
    """An operator's action (retry, delete, pause) could not be carried out."""


class UnknownQueue(AdminError):
    """No queue has this name. ``known`` lists the queues there are (the HTTP answer names those, not the one asked for)."""

    def __init__(self, message: str, known: str = "") -> None:
        super().__init__(message)
        self.known = known


class JobNotFound(AdminError):
    """No job has this id (never existed, deleted, or past its retention)."""


class InvalidQuery(AdminError):
    """A read's filter or page cursor is not one this API knows (an unknown state, a cursor it never gave out)."""


class JobStateConflict(AdminError):
    """The job is not in a state that allows this action (retry a job that has not failed, delete a running one)."""


class InvalidGroupWeight(AdminError):
    """A group's weight must be a whole number from 1 to 1000 and its group a name a job may carry; a group
    whose weight the queue's settings give (``group_weights``) is changed there, not at run time."""


class EventError(ConveyorError):
    """A wait for an event or a signal (``ctx.wait_for``, ``app.events.signal``) could not be carried out."""


class InvalidEventName(EventError):
    """An event name is empty, too long, or has characters other than letters, digits and ``:._-``."""


class WaitTimeout(EventError):
    """Raised by ``ctx.wait_for(..., raise_on_timeout=True)`` when the wait ended by its timeout."""


class EventsUnsupported(EventError):
    """This broker keeps no events (it cannot park a job until a signal)."""


class DatabaseUnavailable(StoreUnavailable):
    """Postgres could not be reached."""


# -- records and limits --------------------------------------------------------


class RecordNotFound(ConveyorError):
    """No record (a user, an API key; a blueprint's task, run or resource) has this ID."""


class RecordConflict(ConveyorError):
    """The record exists with other content, or is in a state that forbids the change."""


class LimitExceeded(ConveyorError):
    """A caller is at one of their limits: try again later. The message names the limit, never the request's values."""


class DatabaseRefused(StoreRefused):
    """Postgres refused a statement for a reason a retry cannot fix: data it cannot store, a constraint, a bug."""


# -- brokers outside enqueue ----------------------------------------------------


class BrokerError(ConveyorError):
    """A broker read, operator action or worker call failed (an enqueue raises :class:`BrokerUnavailable`)."""


class BrokerUnreachable(StoreUnavailable, BrokerError):
    """The broker could not be reached or did not answer in time: the call's effect is unknown."""


class BrokerRejected(StoreRefused, BrokerError):
    """The broker answered with an error (a script error, out of memory, a read-only replica)."""


class EnqueueOutcomeUnknown(EnqueueError):
    """The enqueue may have been applied and no answer came (the connection broke at COMMIT, Redis never
    answered): its jobs exist or not, a batch all together. Enqueue them again only with a key."""
