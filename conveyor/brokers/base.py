"""The broker contract, stated once: what every conveyor broker adds to Dramatiq's ``Broker``.

Dramatiq moves messages; conveyor also needs keyed enqueues, a count of
how often each job started, job records for status and the dashboard,
and a recovery pass for dead workers. Each broker module (redis,
postgres, inline) implements :class:`ConveyorBroker`, declares what it
can do beyond the contract in one :class:`Capabilities` on its class
(River's ``SupportsListener()``), and builds its own companion stores
(:meth:`ConveyorBroker.fleet_store`, :meth:`ConveyorBroker.rollup_store`).
Code above the brokers reads the capabilities, never the broker's name.
One behaviour suite (``tests/contract``) runs against every broker and
skips a test only where the broker's capabilities say it lacks what the
test needs.

The delivery fence. Every delivery of a job carries a number that grows
with each delivery (:meth:`ConveyorBroker.delivery`). Every write a
delivery makes to its job (start, ack, nack, retry, final-failure claim,
cancel outcome, :meth:`TransactionalCompletion.complete_in`) is checked
against the job's current number on the broker's server, in the same
atomic step as the write (the Redis scripts, ``jobs.sql``'s statements):
a superseded delivery changes nothing. Reads (:meth:`ConveyorBroker.is_current`)
answer the same question but may be stale by the time the caller acts.

Safe to repeat: reads; :meth:`ConveyorBroker.maintain` (from many
processes at once); a keyed enqueue (the key returns the first job); the
fenced writes (a repeat of a write its delivery already made, or of a
superseded delivery's, changes nothing); operator actions that answer
False or ``finished`` when there is nothing left to do (retry, promote,
cancel, delete, pause, resume). Not safe to repeat: an enqueue without a
key (each call makes a new job).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, ClassVar, Literal, Protocol, TypeAlias, TypeGuard

import dramatiq.message
from dramatiq import Broker, Message, Middleware
from dramatiq.broker import MessageProxy
from dramatiq.common import q_name
from dramatiq.encoder import JSONEncoder
from dramatiq.middleware import MiddlewareError

from conveyor.errors import EventsUnsupported, InvalidQuery, describe_error
from conveyor.logs import Level, log_event

if TYPE_CHECKING:
    from dramatiq import Middleware
    from psycopg import Connection
    from psycopg_pool import ConnectionPool

    from conveyor.brokers.fleet.base import FleetStore
    from conveyor.brokers.rollup.base import RollupStore
    from conveyor.settings import Settings

__all__ = ["describe_error"]  # brokers import it from here

#: A message as brokers and hooks handle it: the Message itself, or the proxy a consumer handed out.
AnyMessage: TypeAlias = Message[Any] | MessageProxy


def log_delivery_error(
    message: AnyMessage, error: str, *, level: Level = "warning", attempt: int | None = None, queue: str | None = None
) -> None:
    """An ``error`` event about one delivered message: its queue (canonical name), job and id.

    ``queue`` when the message's own names a delay queue the caller has already resolved;
    ``error`` must hold no secret value.
    """
    log_event(
        "error",
        level=level,
        queue=q_name(queue or message.queue_name),
        job=message.actor_name,
        job_id=message.message_id,
        attempt=attempt,
        error=error,
    )


#: Message option a consumer sets on a delivery that runs only the job's final-failure hooks: the job
#: failed for good in an earlier delivery whose worker died before its hooks were marked done. Its
#: body never runs again; the hooks run again (they are at least once). Never stored with the job.
FINALIZE = "conveyor_finalize"

#: The message option holding a job's priority: Dramatiq's per-message ``broker_priority`` (its
#: RabbitMQ broker's, higher first). conveyor takes 0..MAX_PRIORITY; absent means 0.
PRIORITY = "broker_priority"
MAX_PRIORITY = 9


def priority_of(message: AnyMessage) -> int:
    """The job's priority, 0 (the default) to MAX_PRIORITY, higher runs first; out of range is clamped."""
    value = message.options.get(PRIORITY, 0)
    if not isinstance(value, int) or isinstance(value, bool):
        return 0
    return max(0, min(MAX_PRIORITY, value))


def unknown_job_error(job: str) -> str:
    """The mark a job of an unknown type carries (its record's error, shown by the dashboard)."""
    return f"UnknownJob: no worker knows job {job} yet; handed back unattempted until one that does takes it"


def announce_unknown_job(broker: Broker, message: AnyMessage, delay: float) -> None:
    """After a consumer handed back a job of a type this process does not know: a warning, and every
    middleware's ``after_unknown_job(broker, message)`` (the metric). Never raises."""
    log_event(
        "unknown_job",
        level="warning",
        queue=q_name(message.queue_name),
        job=message.actor_name,
        job_id=message.message_id,
        attempt=None,
        delay_s=delay,
        reason="no worker here knows this job type (an older worker in a rolling deploy?): handed back, not attempted",
    )
    for middleware in broker.middleware:
        hook = getattr(middleware, "after_unknown_job", None)
        if hook is not None:
            try:
                hook(broker, message)
            except Exception as exc:
                log_delivery_error(message, f"after_unknown_job of {type(middleware).__name__} raised: {exc!r}")


def malformed_error(exc: BaseException) -> str:
    """The error a job whose stored message cannot be decoded fails with, the same on every broker."""
    cause = getattr(exc, "error", None) or exc  # DecodeError wraps the decoder's error
    return f"MalformedMessage: the stored message cannot be decoded ({describe_error(cause, 500)})"


#: The states a job record can be in, as users see them.
JOB_STATES = (
    "waiting",
    "delayed",
    "awaiting",  # parked until a signal of its event or its timeout (ctx.wait_for)
    "active",
    "completed",
    "failed",
    "cancelled",
)

#: What ``start_job`` returns for a delivery of a job whose cancellation was asked before it started:
#: the start ended it ``cancelled`` (fenced like the start) and the body must not run.
CANCELLED_AT_START = -2

#: Message option set on a delivery whose job ended ``cancelled`` (at its start, or by its cancel outcome):
#: its ack writes nothing, and the middleware count and log it as cancelled. Never stored with the job.
CANCELLED = "conveyor_cancelled"


class CancelOutcome:
    """What :meth:`ConveyorBroker.cancel_job` did (plain strings, as the API and CLI show them)."""

    #: The job was waiting or delayed: it is ``cancelled`` now and never starts.
    CANCELLED = "cancelled"
    #: A worker holds the job: the cancellation is stored and its holder woken; it ends ``cancelled``.
    REQUESTED = "requested"
    #: The job had already ended (completed, failed, cancelled): nothing changed.
    FINISHED = "finished"


def check_state(state: str) -> None:
    """InvalidQuery unless ``state`` is one of :data:`JOB_STATES`. The message lists the states and never
    quotes ``state``: it reaches HTTP clients (the admin API's ``?state=``) through the one error table."""
    if state not in JOB_STATES:
        raise InvalidQuery(f"state: not a job state; states: {', '.join(JOB_STATES)}")


@dataclass(frozen=True)
class JobRef:
    """What an enqueue returns: the job's id, and whether an earlier job with the same key was returned."""

    id: str
    deduplicated: bool = False


@dataclass(frozen=True)
class EnqueueItem:
    """One message to enqueue, with its optional dedup key and delay (ms)."""

    message: Message[Any]
    key: str | None = None
    delay_ms: int | None = None


@dataclass(frozen=True)
class QueueCounts:
    """One queue's numbers, as ``conveyor status`` and the metrics API show them."""

    queue: str
    waiting: int = 0
    delayed: int = 0
    active: int = 0
    failed: int = 0
    completed_total: int = 0
    failed_total: int = 0
    paused: bool = False
    #: UNIX seconds since which the oldest waiting job has waited to be claimed; None when none waits.
    oldest_waiting_at: float | None = None
    #: Of the ``active`` jobs (claimed by a worker), those whose current delivery has started running;
    #: the rest are prefetched: fetched ahead by a worker, not started yet.
    running: int = 0
    #: Jobs that ended ``cancelled`` and are still kept (retention).
    cancelled: int = 0
    #: Jobs parked until a signal of their event or their timeout (``ctx.wait_for``); not in ``delayed``.
    awaiting: int = 0

    @property
    def prefetched(self) -> int:
        """Active jobs a worker fetched ahead and has not started: ``active - running``."""
        return max(0, self.active - self.running)


@dataclass(frozen=True)
class GroupCounts:
    """One named group of a queue as the dashboard's groups view shows it (fair shares, ``group=...``)."""

    group: str
    #: Its jobs ready to run (not delayed, not awaiting an event).
    waiting: int = 0
    #: Its jobs a worker holds (running or prefetched): what the queue's ``group_concurrency`` caps.
    active: int = 0
    #: UNIX seconds since which its oldest waiting job has waited (Redis: the head of its list); None when none waits.
    oldest_waiting_at: float | None = None


@dataclass(frozen=True)
class QueueGroups:
    """The busiest named groups of a queue: most waiting first, then most active, then by name.

    ``total`` counts every named group with a job waiting or active (``groups`` holds at most the limit
    asked for). Jobs enqueued without a group (the default group, never capped) are not listed.
    """

    queue: str
    groups: list[GroupCounts]
    total: int


#: Most groups one :meth:`ConveyorBroker.group_counts` answer lists.
MAX_GROUPS = 500
#: A named group's weight is how many turns it gets per round of its queue's groups (1, the default, to this).
#: A bound keeps one group from taking a queue whole: at 1000 a group of weight 1 still gets a turn a round.
MAX_GROUP_WEIGHT = 1000
#: A group name is stored on every job of the group and in the broker's group keys: short, printable.
MAX_GROUP_LENGTH = 128


def valid_group(group: object) -> bool:
    """Whether ``group`` may name a fair-share group: a string of 1-MAX_GROUP_LENGTH printable characters."""
    return isinstance(group, str) and 0 < len(group) <= MAX_GROUP_LENGTH and group.isprintable()


def valid_group_weight(group: object, weight: object) -> bool:
    """Whether ``weight`` may be the weight of the named group ``group``: an int, 1 to MAX_GROUP_WEIGHT."""
    return valid_group(group) and type(weight) is int and 1 <= weight <= MAX_GROUP_WEIGHT


def busiest_first(groups: list[GroupCounts], limit: int) -> list[GroupCounts]:
    """The order of :class:`QueueGroups` (most waiting, most active, name), cut to ``limit``."""
    return sorted(groups, key=lambda g: (-g.waiting, -g.active, g.group))[: max(0, limit)]


@dataclass
class JobRecord:
    """A job's stored record, as every broker reads it back. Times are UNIX seconds.

    The one row type of a job (issue 19): the read layer's ``JobView``
    (conveyor.inspector) is this record with its payload redacted, and the
    admin API's ``Job`` schema is generated from ``JobView``'s fields. A field
    added here shows in ``app.jobs.get``, ``conveyor jobs`` and the API.
    """

    id: str
    queue: str
    job: str
    state: str
    attempts: int = 0
    key: str | None = None
    payload: dict[str, Any] = field(default_factory=dict)
    error: str | None = None
    enqueued_at: float | None = None
    started_at: float | None = None
    finished_at: float | None = None
    eta: float | None = None
    #: The event an ``awaiting`` job waits for (``ctx.wait_for``); None in every other state.
    event: str | None = None
    #: 0-9, higher runs first (the enqueue's ``priority``).
    priority: int = 0
    #: Its fair-share group (``enqueue(..., group=...)``); None: the default group.
    group: str | None = None


#: Dramatiq's JSONEncoder's output, from one encoder made once (``json.dumps`` with separators makes one per call).
_JSON = json.JSONEncoder(separators=(",", ":"))


def encode_message(message: Message[Any]) -> bytes:
    """``message.encode()``, byte for byte, at about half its cost while Dramatiq's encoder is its stock
    JSONEncoder (the dict built directly, not through ``dataclasses.fields``); any other encoder is asked."""
    if type(dramatiq.message.global_encoder) is not JSONEncoder or type(message) is not Message:
        return message.encode()  # another encoder, or a subclass's fields: as Dramatiq does it
    return _JSON.encode(
        {
            "queue_name": message.queue_name,
            "actor_name": message.actor_name,
            "args": message.args,
            "kwargs": message.kwargs,
            "options": message.options,
            "message_id": message.message_id,
            "message_timestamp": message.message_timestamp,
        }
    ).encode("utf-8")


def as_message(message: AnyMessage) -> Message[Any]:
    """The message itself: a consumer's proxy unwrapped, as Dramatiq's own brokers take either.

    A middleware's ``after_process_message`` gets the proxy, and Dramatiq's
    stock ``Retries`` (or a user's) passes it straight to ``broker.enqueue``;
    ``dataclasses.replace`` and ``copy`` need the dataclass under it. The two
    share one ``options`` dict, so what a middleware wrote there is kept.
    """
    return message._message if isinstance(message, MessageProxy) else message


class SafeMessageProxy(MessageProxy):
    """A message as Dramatiq's own log lines print it: actor and id, never the payload (it may hold secrets)."""

    def __str__(self) -> str:
        return f"{self._message.actor_name}[{self._message.message_id}]"

    __repr__ = __str__


def now_ms() -> int:
    return int(time.time() * 1000)


#: Where the state that goes with a broker lives: its Redis, its Postgres database, or this process's memory.
Store = Literal["redis", "postgres", "memory"]


@dataclass(frozen=True)
class Capabilities:
    """What a broker can do beyond the contract every broker keeps: declared once, on its class.

    Read from the class (``RedisBroker.capabilities``) as well as from a broker: the
    CLI and a worker's supervisor decide by it before (or without) building one.
    Everything else a broker does, it does on every broker; code that depends on one
    of these asks here, never which broker it runs on.
    """

    #: Where state that goes with the broker lives: results, budgets, limits, stream buffers, the schedules'
    #: clock. Companions above the brokers layer pick their own store module by it.
    store: Store
    #: Workers must run inside the process that enqueues (the queue is this process's memory).
    in_process: bool = False
    #: The queue is a Postgres table: the schema is migrated before any worker starts, and ``ctx.once``'s
    #: steps are pruned with the jobs (by the broker), not by the workers.
    queue_in_postgres: bool = False
    #: ``enqueue_jobs`` takes ``connection=``: jobs enqueued in the caller's transaction (:class:`TransactionalEnqueue`).
    transactional_enqueue: bool = False
    #: The broker has ``complete_in``: a job completed inside the caller's transaction (:class:`TransactionalCompletion`).
    transactional_completion: bool = False
    #: A dead worker's jobs come back to the queue after its lease (heartbeats, :meth:`ConveyorBroker.maintain`).
    recovery: bool = True
    #: A delivery can be superseded (taken back, handed to another): :meth:`ConveyorBroker.is_current` can say False.
    fence: bool = True
    #: Messages are stored encoded and decoded by whoever claims them, so a stored message can fail to decode.
    stored_messages: bool = True


class PoolOwner(Protocol):
    """What a Postgres store beside the broker needs: the App's connection pool, opened on first use."""

    @property
    def pool(self) -> ConnectionPool[Connection[Any]]: ...


class ConveyorBroker(Broker):
    """Dramatiq's ``Broker`` plus the operations conveyor needs beyond it.

    Every method here is implemented by each broker module. Each broker class
    lists it first (``class RedisBroker(ConveyorBroker, dramatiq's RedisBroker)``),
    so the method order is as for a mixin; deriving from ``Broker`` lets one type
    name "a Dramatiq broker that is also a conveyor broker".
    """

    #: What this broker can do beyond the contract; each broker class declares its own.
    capabilities: ClassVar[Capabilities]

    # -- the middleware's hooks, without the no-ops ---------------------------------------

    def hooks(self, signal: str, base: type[Middleware] = Middleware) -> tuple[Callable[..., Any], ...]:
        """The bound ``signal`` hooks (``"before_enqueue"``) of this broker's middleware that are instances
        of ``base``, in order, leaving out each that ``base``'s own no-op would answer.

        Which middleware listen is computed once per middleware list (a middleware added later is
        seen); each hook is looked up at the call, as Dramatiq does, so a hook patched onto a class
        later is called. A per-job signal costs one call per middleware that listens to it, where
        Dramatiq calls every middleware's.
        """
        middleware = tuple(self.middleware)
        cached: tuple[tuple[Middleware, ...], dict[tuple[str, type], tuple[Middleware, ...]]] | None
        cached = self.__dict__.get("_conveyor_hooks")
        if cached is None or cached[0] != middleware:
            cached = (middleware, {})
            self.__dict__["_conveyor_hooks"] = cached
        listeners = cached[1].get((signal, base))
        if listeners is None:
            noop = getattr(base, signal, None)
            listeners = tuple(
                m
                for m in middleware
                if isinstance(m, base)
                and hasattr(m, signal)
                and (noop is None or signal in getattr(m, "__dict__", ()) or getattr(type(m), signal) is not noop)
            )
            cached[1][(signal, base)] = listeners
        return tuple(getattr(m, signal) for m in listeners)

    def emit_before(self, signal: str, *args: Any, **kwargs: Any) -> None:
        """Dramatiq's, calling only the middleware that listens (:meth:`hooks`): same order, same errors."""
        name = "before_" + signal
        for hook in self.hooks(name):
            try:
                hook(self, *args, **kwargs)
            except MiddlewareError:
                raise
            except Exception:
                self.logger.critical(
                    "Unexpected failure in %s of %r.", name, getattr(hook, "__self__", hook), exc_info=True
                )

    def emit_after(self, signal: str, *args: Any, **kwargs: Any) -> None:
        """Dramatiq's, calling only the middleware that listens (:meth:`hooks`), in reverse order."""
        name = "after_" + signal
        for hook in reversed(self.hooks(name)):
            try:
                hook(self, *args, **kwargs)
            except Exception:
                self.logger.critical(
                    "Unexpected failure in %s of %r.", name, getattr(hook, "__self__", hook), exc_info=True
                )

    @classmethod
    def from_settings(
        cls,
        settings: Settings,
        *,
        middleware: list[Middleware],
        on_dead: FinalFailure | None,
        database_url: Callable[[], str],
    ) -> ConveyorBroker:
        """The broker ``settings`` configure (the App's composition root calls it; no one else picks a class).

        ``on_dead`` runs the final failure of a job the broker fails by itself (recovery, an undecodable
        message). ``database_url`` is called only by a broker that keeps its queue in Postgres: it may
        start the embedded server. Raises ConfigurationError when a setting the broker needs is missing.
        """
        raise NotImplementedError

    # -- companion stores: the broker builds them, on its own server --------------------

    def fleet_store(self, pools: PoolOwner) -> FleetStore:
        """A new store of the worker registry and attempt history beside this broker's data (``conveyor.brokers.fleet``)."""
        raise NotImplementedError

    @classmethod
    def fleet_store_without_broker(cls, settings: Settings, pools: PoolOwner) -> FleetStore | None:
        """The same data's store for a process that builds no broker (a worker's supervisor); None when no
        other process can reach it (inline)."""
        return None

    def rollup_store(self, pools: PoolOwner) -> RollupStore:
        """A new store of the per-minute history beside this broker's data (``conveyor.brokers.rollup``)."""
        raise NotImplementedError

    def config_warnings(self) -> list[str]:
        """What in the broker server's configuration can lose acknowledged jobs, one sentence each (a banner)."""
        return list(self.config_warning_reasons().values())

    def config_warning_reasons(self) -> dict[str, str]:
        """:meth:`config_warnings` by reason (a metric label); empty when nothing is known to be wrong."""
        return {}

    #: Queue -> its group cap (``Queue.group_concurrency``), set by the App; queues without a cap are absent.
    group_caps: dict[str, int] = {}
    #: Queue -> group -> weight from the queue's settings (``Queue.group_weights``), set by the App; these win
    #: over the weights stored by :meth:`set_group_weight`. Queues without any are absent.
    group_weights: dict[str, dict[str, int]] = {}

    def set_group_weight(self, queue: str, group: str, weight: int) -> None:
        """Store the weight of a named group of ``queue`` (1 to :data:`MAX_GROUP_WEIGHT`, checked by the caller):
        it gets that many turns per round of the queue's groups. Kept until set again (1: the default)."""
        raise NotImplementedError

    def stored_group_weights(self, queue: str) -> dict[str, int]:
        """The weights :meth:`set_group_weight` stored for ``queue``'s named groups, those other than 1."""
        raise NotImplementedError

    def effective_group_weights(self, queue: str) -> dict[str, int]:
        """Each named group's weight other than 1: the stored ones, with the queue's settings' over them."""
        weights = {**self.stored_group_weights(queue), **self.group_weights.get(queue, {})}
        return {g: w for g, w in sorted(weights.items()) if w != 1}

    def enqueue_jobs(self, items: list[EnqueueItem], *, dedup_ttl: float) -> list[JobRef]:
        """Enqueue messages, each atomically with its key: a key held by an existing job returns that job."""
        raise NotImplementedError

    def start_job(self, message: AnyMessage) -> int:
        """Record that a delivery of ``message`` starts running; return its attempt (1-based).

        Returns 0 when the job no longer exists (deleted while waiting): skip it.
        """
        raise NotImplementedError

    def claim_final_failure(self, message: AnyMessage) -> bool:
        """True when this delivery (the current one only) is to run the job's final-failure hooks.

        The claim names the delivery and keeps the job held; the nack that
        follows the hooks marks them done and the job ``failed``. If the
        worker dies in between, recovery hands the job out again as a
        :data:`FINALIZE` delivery, which claims again and runs only the hooks:
        they run at least once, and again only after a crash in them.
        """
        raise NotImplementedError

    def leave_unsettled(self, message: AnyMessage, why: str) -> None:
        """Write no outcome for this delivery: the job stays held and comes back (after a claimed final
        failure, as a :data:`FINALIZE` delivery that runs the hooks again).

        For a final-failure hook that could not finish (a store was away): its nack would mark the
        hooks done. A broker that cannot hand a job back (inline) only says so.
        """
        log_delivery_error(message, f"final-failure hooks not finished and lost: {why}")

    # -- the fence of a job's own effects (JobContext: ctx.delivery, ctx.check_fence) --------

    def delivery(self, message: AnyMessage) -> int | None:
        """The fence number of the delivery ``message`` came with; None for a message no consumer handed out.

        It grows with every delivery of the job (and survives a crash of the
        broker's server), so two deliveries of one job never share it.
        """
        raise NotImplementedError

    def is_current(self, message: AnyMessage) -> bool:
        """Whether ``message``'s delivery is still its job's current one: one read on the broker's server.

        False once the job was taken back (its worker stopped heartbeating
        for a lease) or handed to another delivery, and when the job is gone.
        A job this delivery completed stays current for it. The answer may be
        stale by the time the caller acts on it (a pause right after): only a
        write that checks the fence itself (:meth:`complete_in`) closes that gap.
        """
        raise NotImplementedError

    def maintain(self) -> dict[str, list[str]]:
        """One recovery pass: give dead workers' jobs back to their queues and prune history.

        Returns the ids of the recovered jobs by queue. Safe to run from many processes at once.
        """
        raise NotImplementedError

    def heartbeat_age(self) -> float | None:
        """Seconds (monotonic clock) since this process's last heartbeat that reached the server.

        Counted from when that heartbeat was SENT (the server stamps it later,
        so the age errs on the old side). None before the first one, and for
        brokers without recovery (inline). The worker's watchdog exits the
        process when this nears the lease (conveyor.tasks.watchdog).
        """
        return None

    def queue_counts(self, queue: str) -> QueueCounts:
        """The counts of one queue."""
        raise NotImplementedError

    def group_counts(self, queue: str, *, limit: int = 50) -> QueueGroups:
        """The named groups of ``queue`` with jobs waiting or active, busiest first, at most ``limit`` of them
        (up to :data:`MAX_GROUPS`). A read: each count is as of its own read, not one snapshot of all."""
        raise NotImplementedError

    def get_job(self, job_id: str) -> JobRecord | None:
        """One job record, or None."""
        raise NotImplementedError

    def list_jobs(self, queue: str, state: str, *, limit: int = 50, offset: int = 0) -> list[JobRecord]:
        """Job records of one queue in one state, newest first."""
        raise NotImplementedError

    def pause_queue(self, queue: str) -> None:
        """Workers stop claiming from ``queue`` until it is resumed."""
        raise NotImplementedError

    def resume_queue(self, queue: str) -> None:
        """Undo :meth:`pause_queue`."""
        raise NotImplementedError

    # -- cancel (issue 21) ------------------------------------------------------

    def cancel_job(self, job_id: str) -> str | None:
        """Cancel one job; returns a :class:`CancelOutcome` value, or None when no job has this id.

        In one atomic step: a waiting or delayed job ends ``cancelled`` and never
        starts (a worker that prefetched or holds it until its eta is refused by
        the fence or its start); a job a worker holds keeps running until its
        holder, woken at once, sees ``ctx.cancelled``, interrupts it after the
        grace and writes :meth:`cancel_outcome`. The request is stored with the
        job, so a worker that starts it later (after a restart, a recovery) ends
        it at its start. A job that already ended is left alone.
        """
        raise NotImplementedError

    def cancel_outcome(self, message: AnyMessage, error: str | None = None) -> bool:
        """End this delivery's job ``cancelled``, fenced like an ack; False when the delivery is superseded.

        The late ack, nack or retry of this or any older delivery then changes nothing.
        """
        raise NotImplementedError

    def cancel_requested(self, job_ids: list[str]) -> set[str]:
        """Of these held jobs, those whose cancellation was asked (the check behind a lost wake-up)."""
        raise NotImplementedError

    def cancel_listener(self) -> CancelListener | None:
        """A subscription to cancellations as they are asked (ids of held jobs); None when the broker
        has no channel (inline: a cancel reaches the process's registry directly)."""
        return None

    def completed_in_own_transaction(self, message: AnyMessage) -> bool:
        """Whether this delivery already completed its job in the job's own transaction (``ctx.transaction``
        or ``ctx.complete_in`` committed): the job is done, and a cancel that arrived meanwhile came too late."""
        return False

    # -- operator actions (admin API and dashboard) ---------------------------

    def retry_job(self, job_id: str) -> bool:
        """Put one *failed* job back in its queue, as waiting, with a fresh attempt budget.

        In one atomic step: the job leaves the dead letters, its attempt count
        goes back to 0 (else the retries middleware would count the earlier
        attempts against it and fail it at once), its final-failure claim is
        released (so if it fails for good again, its hooks and the failure
        webhook run again), and its record shows ``waiting``. The last error
        stays on the record until the job completes.

        Returns False, changing nothing, when no failed job has this id
        (unknown, expired, or in another state).
        """
        raise NotImplementedError

    def retry_failed(self, queue: str) -> int:
        """:meth:`retry_job` for every failed job of ``queue``; returns how many were retried.

        Each job moves atomically; the whole batch need not be one transaction.
        """
        raise NotImplementedError

    def promote_job(self, job_id: str) -> bool:
        """Run one *delayed* job now: it becomes waiting at once, in one atomic step, and runs once.

        Its message leaves wherever the delay keeps it (a delay queue, or a
        worker's delay consumer holding it until its eta: that holder's own
        promotion is then refused by the fence, and its copy dropped) and
        enters its queue; idle workers of the queue are woken. A job that
        is no longer delayed (due meanwhile, deleted, running) is left alone.

        Returns False, changing nothing, when no delayed job has this id.
        """
        raise NotImplementedError

    # -- waiting for an event (conveyor.events) ---------------------------------

    def signal_event(self, name: str, resolution: str, ttl: float) -> int:
        """Resume every job awaiting ``name`` with ``resolution`` and keep it ``ttl`` seconds; how many resumed.

        One atomic step: each awaiting job moves to waiting (its delivery
        grows, so whoever held its delayed copy is fenced off) with its
        resolution stored insert-first; a job no longer awaiting (resumed by
        another signal, timed out, deleted) is left alone. The signal is kept
        (the first one's data wins while kept) for jobs that wait later.
        """
        raise EventsUnsupported(f"the {type(self).__name__} keeps no events")

    def resolve_wait(self, job_id: str, name: str, *, timed_out: bool) -> str | None:
        """The job's stored resolution of its wait for ``name``, recorded now if it can be; else None.

        Recorded insert-first, from a kept signal of ``name``, or (``timed_out``:
        the job came back from a park on ``name`` without one) as
        :data:`~conveyor.events.TIMED_OUT`. None: the job is to park.
        """
        raise EventsUnsupported(f"the {type(self).__name__} keeps no events")

    def delete_job(self, job_id: str) -> bool:
        """Remove a job that is not running: its record, its message, its index entries.

        Works in every state but ``active``. A deleted job never runs, even if
        a worker had already prefetched it (``start_job`` then returns 0) or
        holds it until its delay passes; its dedup key is free again.
        Returns False, changing nothing, when the job is unknown or active.
        """
        raise NotImplementedError


class CancelListener(Protocol):
    """The cancel channel of a broker, as a worker process's cancel watcher reads it."""

    def wait(self, timeout: float) -> list[str]:
        """Job ids whose cancellation was asked, arriving within ``timeout`` s (maybe none)."""
        ...

    def close(self) -> None: ...


#: Called once when a job has spent its attempts: ``(broker, message, error text)``.
FinalFailure: TypeAlias = Callable[[ConveyorBroker, AnyMessage, str], None]


class TransactionalEnqueue(Protocol):
    """A broker whose enqueue can join the caller's database transaction (postgres)."""

    def enqueue_jobs(
        self, items: list[EnqueueItem], *, dedup_ttl: float, connection: Connection[Any] | None = None
    ) -> list[JobRef]: ...


class TransactionalCompletion(Protocol):
    """A broker whose job can be completed inside the caller's database transaction (postgres)."""

    def complete_in(self, conn: Connection[Any], message: AnyMessage) -> None:
        """Complete ``message``'s job in ``conn``'s open transaction, only while its delivery is current.

        The completion commits (or rolls back) with the caller's transaction;
        when the delivery is no longer current it raises
        :class:`~conveyor.errors.DeliveryFenced` and writes nothing, so the
        transaction rolls back. The delivery's ordinary ack after a commit
        changes nothing. ``conn`` must be on the broker's own database.
        """
        ...

    def completed_in_transaction(self, message: AnyMessage) -> None:
        """The caller's transaction that ran :meth:`complete_in` committed: the ack writes nothing."""
        ...


def is_transactional(broker: ConveyorBroker) -> TypeGuard[TransactionalEnqueue]:
    """True when ``broker.enqueue_jobs`` takes ``connection=`` (its capability ``transactional_enqueue``)."""
    return broker.capabilities.transactional_enqueue


def completes_in_transaction(broker: ConveyorBroker) -> TypeGuard[TransactionalCompletion]:
    """True when ``broker`` has ``complete_in`` (its capability ``transactional_completion``)."""
    return broker.capabilities.transactional_completion
