"""JobQueue: the one way to enqueue a job."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Iterable, Mapping, TypeVar

from dramatiq import Message
from pydantic import BaseModel, ValidationError

from conveyor.brokers.base import (
    MAX_GROUP_LENGTH,
    MAX_GROUP_WEIGHT,
    MAX_PRIORITY,
    PRIORITY,
    EnqueueItem,
    JobRef,
    encode_message,
    is_transactional,
    valid_group,
    valid_group_weight,
)
from conveyor.errors import InvalidPayload, PayloadTooLarge, TransactionalEnqueueUnsupported, UnknownJob
from conveyor.middleware.base import ConveyorMiddleware

if TYPE_CHECKING:
    from psycopg import Connection

    from conveyor.app import App
    from conveyor.inspector import JobView

#: Dramatiq's delay queues keep a message at most 7 days.
MAX_DELAY_SECONDS = 7 * 24 * 3600
MAX_KEY_LENGTH = 512


@dataclass(frozen=True)
class JobRequest:
    """One job to enqueue; the batch form takes a list of these."""

    job: str
    payload: Any
    key: str | None = None
    delay: float | None = None
    #: 0 (the default) to 9, higher runs first; aging keeps a low one from starving (CONVEYOR_PRIORITY_AGING_SECONDS).
    priority: int = 0
    #: Its fair-share group (a tenant): a queue serves its groups round-robin; None: the default group.
    group: str | None = None


class JobQueue:
    """Validates payloads and enqueues jobs on the configured broker.

    >>> app.jobs.enqueue("credit.consume", {"user_id": "u1", "task_id": "t1",
    ...                  "message_id": "m1", "total_tokens": 1200}, key="credit:t1:m1")
    JobRef(id='…', deduplicated=False)
    """

    def __init__(self, app: "App") -> None:
        self.app = app

    def enqueue(
        self,
        job: str,
        payload: Any,
        *,
        key: str | None = None,
        delay: float | None = None,
        priority: int = 0,
        connection: Connection[Any] | None = None,
        group: str | None = None,
    ) -> JobRef:
        """Enqueue one job. With ``key``, a second enqueue within ``CONVEYOR_DEDUP_TTL`` returns the first job.

        ``priority`` (0-9, higher first): a job overtakes lower-priority ones that became ready at most
        ``priority x CONVEYOR_PRIORITY_AGING_SECONDS`` earlier, never more, so none starves.

        With ``connection`` (a psycopg connection to the broker's database;
        postgres broker only), the job is enqueued inside that connection's
        transaction: it exists if and only if the transaction commits.

        With ``group`` (a tenant, e.g. ``"user:42"``; 1-128 printable characters), the queue serves
        its groups round-robin, so one group's backlog does not delay the others, and runs at most
        the queue's ``group_concurrency`` jobs of one group at once. Jobs without a group are one
        group of their own. The postgres and redis brokers serve groups fairly; inline accepts the group
        and serves the job as any other.

        Raises :class:`~conveyor.errors.EnqueueError` subclasses; when one is raised nothing was enqueued,
        except :class:`~conveyor.errors.EnqueueOutcomeUnknown`: the job may exist (enqueue it again only
        with a key, which then returns it).
        """
        return self.enqueue_many([JobRequest(job, payload, key, delay, priority, group)], connection=connection)[0]

    def enqueue_many(
        self, requests: Iterable[JobRequest | Mapping[str, Any]], *, connection: Connection[Any] | None = None
    ) -> list[JobRef]:
        """Enqueue a batch in one round trip, all of it or none. Every payload is validated before anything is sent."""
        broker = self.app.broker
        if connection is not None and not is_transactional(broker):
            raise TransactionalEnqueueUnsupported(
                f"the {self.app.settings.broker_name} broker cannot enqueue inside a database transaction "
                f"(connection=...); only CONVEYOR_BROKER=postgres keeps jobs in Postgres"
            )
        items = [self.prepare(r if isinstance(r, JobRequest) else JobRequest(**r)) for r in requests]
        if not items:
            return []
        if connection is not None and is_transactional(broker):
            refs = broker.enqueue_jobs(items, dedup_ttl=self.app.settings.dedup_ttl, connection=connection)
        else:
            refs = broker.enqueue_jobs(items, dedup_ttl=self.app.settings.dedup_ttl)
        # Middleware may count what was enqueued and what was a duplicate (metrics). Inside the
        # caller's transaction they count when sent, even if that transaction rolls back later.
        for hook in broker.hooks("after_enqueue_jobs", ConveyorMiddleware):
            hook(broker, items, refs)
        return refs

    def get(self, job_id: str) -> JobView:
        """The job's state, attempts, errors (scrubbed) and times, with every attempt; JobNotFound if none."""
        from conveyor.inspector import Inspector

        return Inspector(self.app).job(job_id)

    def cancel(self, job_id: str) -> str:
        """Cancel one job; returns what happened (``conveyor.brokers.base.CancelOutcome``):

        ``"cancelled"``: it was waiting or delayed and never starts; ``"requested"``: a worker holds it,
        it sees ``ctx.cancelled`` now, is interrupted after ``CONVEYOR_CANCEL_GRACE_SECONDS`` if it
        still runs, and ends ``cancelled``; ``"finished"``: it had already ended, nothing changed.
        The cancellation is stored by the broker: it holds across worker restarts.
        Raises :class:`~conveyor.errors.JobNotFound` when no job has this id.
        """
        from conveyor.errors import JobNotFound

        outcome = self.app.broker.cancel_job(job_id)
        if outcome is None:
            raise JobNotFound("no job with this id")
        return outcome

    def set_group_weight(self, queue: str, group: str, weight: int) -> None:
        """Give the named group ``group`` of ``queue`` the weight ``weight`` (1 to 1000; 1 is every group's
        default): with backlogs in all of them, groups of weights 3, 2 and 1 get 3, 2 and 1 turns per round.
        Stored by the broker, so every worker serves by it from its next claim, and kept until set again.
        Raises :class:`~conveyor.errors.UnknownQueue` for a queue this app does not have, and
        :class:`~conveyor.errors.InvalidGroupWeight` for a bad group name or weight, or a group whose weight
        the queue's settings give (``Queue(group_weights=...)``, CONVEYOR_QUEUES__<Q>__GROUP_WEIGHTS), which win.
        """
        from conveyor.errors import InvalidGroupWeight, UnknownQueue

        spec = self.app.queues.get(queue)
        if spec is None:
            known = ", ".join(self.app.queues)
            raise UnknownQueue(f"no queue {queue!r}; queues: {known}", known)
        if not valid_group_weight(group, weight):
            raise InvalidGroupWeight(
                f"a weight is a whole number from 1 to {MAX_GROUP_WEIGHT}, for a group name of 1-{MAX_GROUP_LENGTH} "
                "printable characters"
            )
        if group in dict(spec.group_weights):
            raise InvalidGroupWeight(
                "this group's weight is set in the queue's settings (group_weights): change it there"
            )
        self.app.broker.set_group_weight(queue, group, weight)

    def group_weights(self, queue: str) -> dict[str, int]:
        """The weights of ``queue``'s named groups other than 1 (every other group's is 1): those stored by
        :meth:`set_group_weight`, with the queue's settings' over them."""
        from conveyor.errors import UnknownQueue

        if queue not in self.app.queues:
            known = ", ".join(self.app.queues)
            raise UnknownQueue(f"no queue {queue!r}; queues: {known}", known)
        return self.app.broker.effective_group_weights(queue)

    def cancel_where(self, *, queue: str, job: str | None = None, state: str | None = None) -> int:
        """Cancel every job of ``queue`` (of type ``job``, in ``state``: waiting, delayed or active; all
        three when None) as :meth:`cancel` does, one at a time; returns how many were cancelled or asked."""
        from conveyor.errors import InvalidQuery

        states = ("waiting", "delayed", "active")
        if state is not None and state not in states:
            raise InvalidQuery(f"state: cancel applies to {', '.join(states)} jobs only")
        if queue not in self.app.queues:
            raise InvalidQuery("queue: not a queue of this app")
        broker = self.app.broker
        ids: list[str] = []
        for name in (state,) if state else states:
            offset = 0
            while True:
                page = broker.list_jobs(queue, name, limit=500, offset=offset)
                ids += [r.id for r in page if job is None or r.job == job]
                if len(page) < 500:
                    break
                offset += len(page)
        done = 0
        for job_id in dict.fromkeys(ids):
            if broker.cancel_job(job_id) in ("cancelled", "requested"):
                done += 1
        return done

    def result(self, job_id: str, timeout: float = 30.0) -> Any:
        """The job's stored return value (``store_result=True``), waiting up to ``timeout`` seconds.

        Waits on the store's wake-up, not a polling loop. Raises
        :class:`~conveyor.errors.JobFailed` if the job failed for good,
        :class:`~conveyor.errors.ResultTimeout` if it has not finished in time.
        """
        from conveyor.results import wait_result

        return wait_result(self.app, job_id, timeout)

    def prepare(self, request: JobRequest) -> EnqueueItem:
        """Validate one request and build its message, or raise a clear error naming job and field."""
        job_type = self.app.job_types.get(request.job)
        if job_type is None:
            raise UnknownJob(request.job, list(self.app.job_types))
        payload = validate_payload(request.job, job_type.payload, request.payload)
        if request.key is not None and not (0 < len(request.key) <= MAX_KEY_LENGTH):
            raise InvalidPayload(request.job, [{"loc": ("key",), "msg": f"must be 1-{MAX_KEY_LENGTH} characters"}])
        if request.delay is not None and not (0 <= request.delay <= MAX_DELAY_SECONDS):
            raise InvalidPayload(request.job, [{"loc": ("delay",), "msg": f"must be 0-{MAX_DELAY_SECONDS} seconds"}])
        priority = request.priority
        if not isinstance(priority, int) or isinstance(priority, bool) or not 0 <= priority <= MAX_PRIORITY:
            raise InvalidPayload(request.job, [{"loc": ("priority",), "msg": f"must be an integer 0-{MAX_PRIORITY}"}])
        options: dict[str, Any] = {"key": request.key} if request.key else {}
        if priority:
            options[PRIORITY] = priority  # absent means 0: a plain job's message is as before
        if request.group is not None:
            if not valid_group(request.group):
                raise InvalidPayload(
                    request.job, [{"loc": ("group",), "msg": f"must be 1-{MAX_GROUP_LENGTH} printable characters"}]
                )
            options["group"] = request.group
        message: Message[Any] = Message(
            queue_name=job_type.queue,
            actor_name=job_type.name,
            args=(payload.model_dump(mode="json"),),
            kwargs={},
            options=options,
        )
        size = len(encode_message(message))
        if size > self.app.settings.max_payload_bytes:
            raise PayloadTooLarge(
                f"payload of job {request.job!r} is {size} bytes encoded; "
                f"the limit is {self.app.settings.max_payload_bytes} (CONVEYOR_MAX_PAYLOAD_BYTES)"
            )
        delay_ms = None if request.delay is None else int(request.delay * 1000)
        return EnqueueItem(message, request.key, delay_ms)


#: A payload model: a :class:`Payload`, or a root model such as agent.build's union of variants.
M = TypeVar("M", bound=BaseModel)


def validate_payload(job: str, model: type[M], payload: Any) -> M:
    """The payload as its model, or :class:`InvalidPayload` listing each bad field (never its value)."""
    try:
        if isinstance(payload, model):
            return payload
        if isinstance(payload, BaseModel):
            payload = payload.model_dump()
        if isinstance(payload, (str, bytes)):
            return model.model_validate_json(payload)
        return model.model_validate(payload)
    except ValidationError as exc:
        # Keep location and message only: the input value may be a secret.
        raise InvalidPayload(job, [{"loc": e["loc"], "msg": e["msg"]} for e in exc.errors()]) from None
