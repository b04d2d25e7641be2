"""The production broker: Dramatiq's RedisBroker, with conveyor's job records and delivery fence.

It keeps Dramatiq's key layout and replaces its Lua with ``jobs.lua``, so
that a keyed enqueue, a fetch, a start, an outcome, a promotion and a
recovery each change queue and job record in one atomic step, on the
server's clock, fenced by the job's delivery number.

The commands themselves, every script call and every read of keys, are
:class:`~.jobs.Jobs`'s (``jobs.py``, which owns ``jobs.lua``), as the
Postgres broker's are ``postgres/jobs.py``'s: this module turns Dramatiq's
calls into its calls, runs the middleware hooks, and keeps what this
process holds.

Ownership, in one place: a message this process fetched is *held*
(``deliveries``, see ``deliveries.py``) from the fetch until its outcome is written. Held messages are
never handed back by :meth:`maintain`'s release pass; anything else in this
worker's acks sets is not in flight here (a replaced consumer's leftovers,
an outcome that hit a bug) and goes back to its queue as a new delivery.
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading
import time
import uuid
from typing import TYPE_CHECKING, Any

import redis
from dramatiq import Message, Middleware
from dramatiq.brokers.redis import RedisBroker as DramatiqRedisBroker
from dramatiq.common import current_millis, dq_name, q_name
from dramatiq.errors import ConnectionClosed, DecodeError, QueueJoinTimeout
from dramatiq.middleware import SkipMessage

from conveyor.brokers.base import (
    CANCELLED,
    CANCELLED_AT_START,
    AnyMessage,
    CancelListener,
    Capabilities,
    ConveyorBroker,
    EnqueueItem,
    FinalFailure,
    JobRecord,
    JobRef,
    PoolOwner,
    QueueCounts,
    QueueGroups,
    announce_unknown_job,
    as_message,
    check_state,
    encode_message,
    log_delivery_error,
    malformed_error,
    priority_of,
    unknown_job_error,
)
from conveyor.brokers.redis.consumer import DELIVERY_OPTIONS, AckBuffer, RedisConsumer, delivery_of
from conveyor.brokers.redis.deliveries import Deliveries, Retry, refused
from conveyor.brokers.redis.jobs import Fetched, Jobs, NewJob, storable
from conveyor.errors import (
    BrokerRejected,
    BrokerUnavailable,
    BrokerUnreachable,
    ConfigurationError,
    EnqueueOutcomeUnknown,
)
from conveyor.events import PARK
from conveyor.logs import log_error, log_event
from conveyor.redis_client import client as redis_client
from conveyor.redis_client import is_unavailable, translated

if TYPE_CHECKING:
    from collections.abc import Callable

    from conveyor.brokers.fleet.base import FleetStore
    from conveyor.brokers.rollup.base import RollupStore
    from conveyor.settings import Settings

_MS = 1000  # settings are in seconds, the script counts milliseconds

#: Seconds a job's start (or its final-failure claim) waits for Redis to come back before giving up on it.
START_GRACE = 5.0


class RedisBroker(ConveyorBroker, DramatiqRedisBroker):
    """Dramatiq's RedisBroker plus keyed enqueue, attempts, job records and the delivery fence."""

    #: Built here, with decode_responses off: replies are bytes (see replies.text).
    client: redis.Redis

    #: Jobs are Redis keys: none joins a Postgres transaction; a queue is a FIFO list (actor priority orders
    #: only a worker's work queue, Dramatiq's design).
    capabilities = Capabilities(store="redis")

    @classmethod
    def from_settings(
        cls,
        settings: Settings,
        *,
        middleware: list[Middleware],
        on_dead: FinalFailure | None,
        database_url: Callable[[], str],
    ) -> RedisBroker:
        if not settings.redis_url:
            raise ConfigurationError("CONVEYOR_BROKER=redis needs REDIS_URL")
        return cls(
            url=settings.redis_url,
            middleware=middleware,
            namespace=settings.redis_namespace,
            heartbeat_timeout=settings.heartbeat_timeout,
            retention=settings.retention,
            settings=settings,
            on_dead=on_dead,
        )

    def fleet_store(self, pools: PoolOwner) -> FleetStore:
        from conveyor.brokers.fleet.redis_store import RedisFleetStore

        return RedisFleetStore(
            self.client, self.keys.shared, dedup_keys=self.jobs.dedup_keys, enqueued_keys=self.jobs.enqueued_keys
        )

    @classmethod
    def fleet_store_without_broker(cls, settings: Settings, pools: PoolOwner) -> FleetStore | None:
        from conveyor.brokers.fleet.redis_store import RedisFleetStore

        if not settings.redis_url:
            return None
        return RedisFleetStore(redis_client(settings.redis_url, settings), settings.redis_namespace)

    def rollup_store(self, pools: PoolOwner) -> RollupStore:
        from conveyor.brokers.rollup.redis_store import RedisRollupStore

        return RedisRollupStore(self.client, self.keys.shared)

    def __init__(
        self,
        *,
        url: str,
        middleware: list[Middleware],
        namespace: str,
        heartbeat_timeout: float,
        retention: float,
        settings: Settings,
        on_dead: FinalFailure | None = None,
    ) -> None:
        # The pool is built here, from the settings: Dramatiq's from_url(url) would drop every option.
        client = redis_client(url, settings)
        # Dramatiq's RedisBroker.__init__ is unannotated.
        super().__init__(  # type: ignore[no-untyped-call]
            middleware=middleware,
            namespace=namespace,
            client=client,
            # conveyor drives recovery itself (see maintain); never at random.
            maintenance_chance=0,
            heartbeat_timeout=int(heartbeat_timeout * _MS),
            dead_message_ttl=int(retention * _MS),
        )
        #: Every command of this broker (the script's calls and the reads beside them).
        self.jobs = Jobs(
            client,
            namespace,
            self.broker_id,
            settings=settings,
            heartbeat_timeout=heartbeat_timeout,
            retention=retention,
            declared=lambda: self.queues,
        )
        self.unknown_job_delay = settings.unknown_job_delay
        #: Seconds of waiting one priority level is worth (jobs.lua: a rank is ready_at - priority x this).
        self.priority_aging = settings.priority_aging_seconds
        #: An idle consumer's BLPOP never outlasts half the socket timeout (or it would read as a timeout).
        self.wait_cap = max(0.1, settings.redis_socket_timeout / 2)
        #: On Redis Cluster every key of a queue carries the queue as its hash tag (see keys.py).
        self.cluster = self.jobs.cluster
        self.keys = self.jobs.keys
        #: Runs the final-failure hook of a job the broker itself fails (an undecodable message), as on Postgres.
        self._on_dead = on_dead
        #: What this process holds: fetched deliveries not settled yet, and retries their acks will write.
        self.deliveries = Deliveries()
        self.acks = AckBuffer(self)
        self._lock = threading.Lock()
        self._consumed: set[str] = set()
        self._config_warnings: dict[str, str] | None = None
        #: A queue's consumer and its delay queue's start at once: one of them reads the config and logs.
        self._config_lock = threading.Lock()

    # -- plumbing -----------------------------------------------------------

    def heartbeat_age(self) -> float | None:
        return self.jobs.heartbeat_age()

    @property
    def consumer_class(self) -> type[RedisConsumer]:
        return RedisConsumer

    def consume(self, queue_name: str, prefetch: int = 1, timeout: int = 5000) -> RedisConsumer:
        with self._lock:
            self._consumed.add(queue_name)
        with contextlib.suppress(Exception):
            self.config_warnings()
        return RedisConsumer(self, queue_name, prefetch, timeout)

    def close(self) -> None:
        """A graceful stop: send buffered acks, hand back what this worker holds and runs nowhere, leave.

        By now Dramatiq's worker has handed back its prefetched and delayed
        messages through the consumers; the release pass returns whatever a
        replaced consumer left behind. Jobs still running (past the shutdown
        timeout, or of another worker in this process) and outcomes that
        cannot be written now stay held, and are recovered after the
        heartbeat timeout if this process exits.
        """
        try:
            self.acks.close()
        except Exception as exc:
            log_error(f"buffered acks not sent, their jobs will run again: {type(exc).__name__}: {exc}")
        try:
            self.release_orphans()
            with self._lock:
                consumed = set(self._consumed)
            left = self.deliveries.any_held()
            if consumed and not left:
                self.jobs.leave(consumed)
        except Exception as exc:
            log_error(f"could not hand back held jobs, recovery will: {type(exc).__name__}: {exc}")
        self.jobs.close()

    # -- the consumer's calls (RedisConsumer and AckBuffer use these and ``deliveries``, nothing private) -----

    def fetch(self, name: str, room: int) -> list[Fetched]:
        """Fetch up to ``room`` messages of list ``name``: (rid, data, delivery, note, wait ms or None) each.

        Each is held (``deliveries``) inside the same critical section the
        release pass uses, so none is handed back while this worker has it.
        """
        with self.deliveries.fetching(name):
            cap = self.group_caps.get(q_name(name)) or 0  # held jobs of one named group, fleet-wide (0: no cap)
            weights = self.group_weights.get(q_name(name))  # the queue's settings' group weights (win)
            rows = self.jobs.fetch(name, room, int(self.priority_aging * _MS), cap, weights)
            for rid, _, delivery, _, _ in rows:
                self.deliveries.hold(name, rid, delivery)
        return rows

    def send_acks(self, name: str, items: list[str | int]) -> list[Any]:
        """Write buffered acks of list ``name`` ((rid, job id, delivery) flat) in one script call; returns the
        job ids whose ack was refused (superseded deliveries). Raises if Redis did not take them."""
        return self.jobs.acks(name, items)

    def write_retry(self, name: str, rid: str, job_id: str, delivery: int, retry: Retry) -> None:
        """A failed delivery's outcome and its next run (``retry``), in one fenced script call; unholds it."""
        done = self.jobs.retry(name, rid, job_id, delivery, retry)
        self.deliveries.settle(name, [(rid, delivery)])
        if done == -1:
            refused("retry", q_name(name), job_id)

    def write_nack(self, name: str, rid: str, job_id: str, delivery: int, error: str) -> None:
        """A delivery failed for good: fenced, it fails the job; unholds it."""
        done = self.jobs.nack(name, rid, job_id, delivery, error)
        self.deliveries.settle(name, [(rid, delivery)])
        if done == -1:
            refused("failure", q_name(name), job_id)

    def hand_back(self, name: str, pairs: list[tuple[str, int]]) -> None:
        """(rid, delivery) pairs go back to their queue as new deliveries, unattempted; unholds them."""
        if not pairs:
            return
        self.jobs.requeue(name, pairs)
        self.deliveries.settle(name, pairs)

    # -- enqueue -------------------------------------------------------------

    def enqueue(self, message: Message[Any], *, delay: int | None = None) -> Message[Any]:
        """Dramatiq's enqueue: a new job; a running delivery's retry; or a delay queue's promotion.

        ``message`` may be the proxy a middleware was handed (Dramatiq's stock Retries passes it).
        """
        message = as_message(message)
        origin = message.options.get("redis_queue")
        if origin is not None and delivery_of(message) is not None:
            if origin.endswith(".DQ") and delay is None:
                return self._promote(message, origin)
            return self._stash_retry(message, delay)
        return self._enqueue_many([EnqueueItem(_fresh(message), None, delay)], dedup_ttl=1)[0][0]

    def enqueue_jobs(self, items: list[EnqueueItem], *, dedup_ttl: float) -> list[JobRef]:
        return [ref for _, ref in self._enqueue_many(items, dedup_ttl=dedup_ttl)]

    def _prepare(self, message: Message[Any], delay_ms: int | None) -> Message[Any]:
        """A copy with its own redis id (and, delayed, in the delay queue with its eta): one copy, not two."""
        message = as_message(message)
        if type(message) is not Message:  # a subclass keeps its own fields: Dramatiq's copies
            message = message.copy(options={"redis_message_id": str(uuid.uuid4())})
            if delay_ms is not None:
                message = message.copy(
                    queue_name=dq_name(message.queue_name), options={"eta": current_millis() + delay_ms}
                )
            return message
        options = {**message.options, "redis_message_id": str(uuid.uuid4())}
        queue_name = message.queue_name
        if delay_ms is not None:
            queue_name = dq_name(queue_name)
            options["eta"] = current_millis() + delay_ms
        return type(message)(
            queue_name,
            message.actor_name,
            message.args,
            message.kwargs,
            options,
            message.message_id,
            message.message_timestamp,
        )

    def _enqueue_many(self, items: list[EnqueueItem], *, dedup_ttl: float) -> list[tuple[Message[Any], JobRef]]:
        """The whole batch in one script call: all of it is enqueued or none, and the error says which.

        On Redis Cluster one script call reaches one queue's slot: a batch spanning queues is one call
        per queue, each all or nothing; a call failing after another succeeded is an outcome unknown.
        """
        if not self.cluster:
            return self._enqueue_scope(items, dedup_ttl=dedup_ttl, queue=None)
        by_queue: dict[str, list[int]] = {}
        for i, item in enumerate(items):
            by_queue.setdefault(q_name(item.message.queue_name), []).append(i)
        out: list[tuple[Message[Any], JobRef] | None] = [None] * len(items)
        done: list[str] = []
        for queue, positions in by_queue.items():
            self.jobs.register_queue(queue)
            try:
                part = self._enqueue_scope([items[i] for i in positions], dedup_ttl=dedup_ttl, queue=queue)
            except (BrokerUnavailable, EnqueueOutcomeUnknown) as exc:
                if not done:
                    raise
                raise EnqueueOutcomeUnknown(
                    f"the jobs of queue(s) {', '.join(done)} were enqueued, those of {queue} and after it may not "
                    f"have been ({exc}); on Redis Cluster a batch is atomic per queue: enqueue again only with a key"
                ) from exc
            for i, result in zip(positions, part):
                out[i] = result
            done.append(queue)
        return [x for x in out if x is not None]

    def _enqueue_scope(
        self, items: list[EnqueueItem], *, dedup_ttl: float, queue: str | None
    ) -> list[tuple[Message[Any], JobRef]]:
        prepared: list[tuple[Message[Any], EnqueueItem]] = []
        rows: list[NewJob] = []
        for item in items:
            message = self._prepare(item.message, item.delay_ms)
            self.emit_before("enqueue", message, item.delay_ms)
            prepared.append((message, item))
            rows.append(
                NewJob(
                    message.queue_name,
                    message.options["redis_message_id"],
                    message.message_id,
                    encode_message(message),
                    message.actor_name,
                    item.key or "",
                    "" if item.delay_ms is None else int(item.delay_ms),
                    storable(message.options.get("last_error", "")),
                    priority_of(message),
                    str(message.options.get("group") or ""),
                )
            )
        refs = self.jobs.enqueue(rows, dedup_ttl=dedup_ttl, aging_ms=int(self.priority_aging * _MS), queue=queue)
        out: list[tuple[Message[Any], JobRef]] = []
        for (message, item), ref in zip(prepared, refs):
            if not ref.deduplicated:
                self.emit_after("enqueue", message, item.delay_ms)
            out.append((message, ref))
        return out

    def _stash_retry(self, message: Message[Any], delay: int | None) -> Message[Any]:
        """The Retries middleware's retry of a running delivery. It is written by that delivery's ack, in the
        same script call (``retry``): never an ack without its retry, never a retry left half-written."""
        rid, delivery = delivery_of(message)  # type: ignore[misc]
        new = self._prepare(_fresh(message).copy(queue_name=q_name(message.queue_name)), delay)
        event = new.options.pop(PARK, None) or ""
        resume = b""
        if event:
            ready = dataclasses.replace(new, queue_name=q_name(message.queue_name), options=dict(new.options))
            ready.options.pop("eta", None)
            resume = encode_message(ready)
        self.emit_before("enqueue", new, delay)
        retry = Retry(
            new.options["redis_message_id"],
            encode_message(new),
            "" if delay is None else int(delay),
            storable(new.options.get("last_error", "")),
            event,
            resume,
        )
        self.deliveries.stash_retry(message.message_id, delivery, retry)
        self.emit_after("enqueue", new, delay)
        return new

    def _promote(self, message: Message[Any], origin: str) -> Message[Any]:
        """A held delayed message is due: one script moves it to its queue (see ``promote`` in jobs.lua)."""
        rid, delivery = delivery_of(message)  # type: ignore[misc]
        moved = _fresh(message).copy(queue_name=q_name(origin), options={"redis_message_id": rid})
        moved.options.pop("eta", None)
        self.emit_before("enqueue", moved, None)
        try:
            done = self.jobs.promote(origin, rid, message.message_id, delivery, encode_message(moved))
        except redis.RedisError as exc:
            if is_unavailable(exc):
                raise ConnectionClosed(exc) from None
            raise BrokerRejected(f"Redis refused the promotion: {type(exc).__name__}: {exc}") from exc
        self.deliveries.settle(origin, [(rid, delivery)])
        if done == -1:
            # Its copy is dropped: the job was promoted by an operator (promote_job), or taken back by recovery.
            why = "the job was promoted by an operator, or handed to another delivery"
            refused("promotion", q_name(origin), message.message_id, why)
        elif done == 1:
            self.emit_after("enqueue", moved, None)
        return moved

    # -- worker side ---------------------------------------------------------

    def start_job(self, message: AnyMessage) -> int:
        held = delivery_of(message)
        if held is None:
            return 0
        rid, delivery = held
        queue = message.queue_name
        deadline = time.monotonic() + START_GRACE
        while True:
            acks = self.acks.take(queue)
            try:
                attempt, refused_acks = self.jobs.start(queue, rid, message.message_id, delivery, acks)
                break
            except Exception as exc:
                self.acks.restore(queue, acks)
                # Raising would not stop the job (Dramatiq logs and swallows a hook's error), and
                # without a counted, fenced start it must not run: hand it back.
                if not is_unavailable(exc) or time.monotonic() >= deadline:
                    message.options["redis_release"] = True
                    log_delivery_error(
                        message,
                        f"could not record the start, job handed back: {type(exc).__name__}",
                        queue=queue,
                    )
                    raise SkipMessage("Redis is unavailable") from None
                time.sleep(0.2)
        self.acks.sent(queue, acks, refused_acks)
        if attempt == -1:
            refused("start", q_name(queue), message.message_id)
            return 0
        if attempt == CANCELLED_AT_START:
            message.options[CANCELLED] = True
        return attempt

    def claim_final_failure(self, message: AnyMessage) -> bool:
        held = delivery_of(message)
        if held is None:
            return False
        rid, delivery = held
        deadline = time.monotonic() + START_GRACE
        while True:
            try:
                error = message.options.get("last_error") or ""
                claimed = self.jobs.claim_final(message.queue_name, rid, message.message_id, delivery, error)
                break
            except Exception as exc:
                if not is_unavailable(exc) or time.monotonic() >= deadline:
                    # Not failed for good yet: its nack hands it back, and the next delivery claims again
                    # (the Retries hook that called this swallows what it raises).
                    message.options["redis_unsettled"] = True
                    log_delivery_error(
                        message,
                        f"could not claim the final failure, job handed back: {type(exc).__name__}",
                        attempt=message.options.get("attempt"),
                    )
                    if is_unavailable(exc):
                        raise BrokerUnreachable(f"could not claim the final failure: {type(exc).__name__}") from exc
                    raise BrokerRejected(f"final-failure claim refused: {type(exc).__name__}: {exc}") from exc
                time.sleep(0.2)
        if claimed == -1:
            refused("final-failure claim", q_name(message.queue_name), message.message_id)
        return claimed == 1

    def leave_unsettled(self, message: AnyMessage, why: str) -> None:
        """Its nack hands the job back (as after a claim that could not be written); fetch makes the next
        delivery a finalize one when the final failure was claimed."""
        message.options["redis_unsettled"] = True
        log_delivery_error(message, f"job handed back unsettled: {why}", attempt=message.options.get("attempt"))

    def hand_back_unknown(self, name: str, rid: str, delivery: int, message: Message[Any], data: bytes) -> None:
        """A fetched job of a type this process does not know: to the delay queue, unattempted (the
        ``retry`` script), marked on its record. Not written: the release pass hands it back."""
        try:
            done = self.jobs.hand_back_unknown(
                name,
                rid,
                message.message_id,
                delivery,
                data,
                self.unknown_job_delay,
                unknown_job_error(message.actor_name),
            )
        finally:
            self.deliveries.settle(name, [(rid, delivery)])
        if done == -1:
            refused("hand-back", q_name(name), message.message_id)
        else:
            announce_unknown_job(self, message, self.unknown_job_delay)

    # -- the fence of a job's own effects -------------------------------------------

    def delivery(self, message: AnyMessage) -> int | None:
        held = delivery_of(message)
        return None if held is None else held[1]

    @translated
    def is_current(self, message: AnyMessage) -> bool:
        """One HMGET of the job's record: does it still point at this message and this delivery (jobs.lua's fence)?"""
        held = delivery_of(message)
        if held is None:
            return False
        rid, delivery = held
        return self.jobs.is_current(message.queue_name, message.message_id, rid, delivery)

    def fail_malformed(self, name: str, rid: str, delivery: int, exc: Exception) -> None:
        """A fetched message that cannot be decoded goes to the dead letters; its job, if its id could be
        read, fails with it (counted once) and its final-failure hook runs with no payload, as on Postgres."""
        error = malformed_error(exc)
        claimed, job_id, job = self.jobs.poison(name, rid, delivery, error)
        self.deliveries.settle(name, [(rid, delivery)])
        queue = q_name(name)
        if not job_id:
            log_error(f"malformed message {rid} moved to the dead letters: {error}", level="error", queue=queue)
            return
        log_event("failed", level="error", queue=queue, job=job or None, job_id=job_id, attempt=None, error=error)
        if not claimed or self._on_dead is None:
            return
        # The hook gets no payload: the message is the one thing that could not be read.
        message: Message[Any] = Message(
            queue_name=queue, actor_name=job, args=(), kwargs={}, options={"attempt": 0}, message_id=job_id
        )
        try:
            self._on_dead(self, message, error)
        except Exception as hook_error:
            log_event(
                "error",
                level="error",
                queue=queue,
                job=job or None,
                job_id=job_id,
                attempt=0,
                error=f"final-failure handling raised {type(hook_error).__name__}: {hook_error}",
            )

    @translated
    def maintain(self) -> dict[str, list[str]]:
        """Recover dead workers' jobs (server clock), hand back what this worker holds but runs nowhere, prune."""
        recovered = self.jobs.maintain(sorted(self.queues), self.dead_message_ttl)
        self.release_orphans()
        return recovered

    @translated
    def release_orphans(self) -> dict[str, list[str]]:
        """This worker's held-but-not-in-flight messages go back to their queues (the Postgres broker's twin).

        A consumer replaced after a connection error leaves its prefetched and
        delayed messages in this worker's acks sets; so does an outcome that
        failed on something other than the connection. Nothing else would
        return them while this worker lives.
        """
        with self._lock:
            consumed = sorted(self._consumed)
        released: dict[str, list[str]] = {}
        for name in consumed:
            with self.deliveries.fetching(name):
                held = self.deliveries.held(name)
                ids = self.jobs.release(name, held)
            if ids:
                released[q_name(name)] = ids
                log_event(
                    "released",
                    level="warning",
                    queue=q_name(name),
                    job=None,
                    job_id=None,
                    attempt=None,
                    count=len(ids),
                    reason="held by this worker but in flight nowhere: handed back",
                )
        return released

    # -- configuration ---------------------------------------------------------

    def config_warnings(self) -> list[str]:
        """What in Redis's configuration can lose acknowledged jobs, one sentence each (the dashboard's banner).

        Read once (CONFIG GET); a warning is logged for each at the first read.
        """
        return list(self.config_warning_reasons().values())

    def config_warning_reasons(self) -> dict[str, str]:
        with self._config_lock:
            return self._read_config_warnings()

    def _read_config_warnings(self) -> dict[str, str]:
        if self._config_warnings is not None:
            return dict(self._config_warnings)
        config = self.jobs.read_config()
        if config is None:  # CONFIG is renamed or forbidden (managed Redis): nothing to say
            self._config_warnings = {}
            return {}
        warnings = {}
        if config.get("appendonly") == "no" and not config.get("save", "").strip():
            warnings["no_persistence"] = (
                "Redis keeps nothing on disk (appendonly no, no save points): a restart "
                "loses every enqueued job, job record and dedup key"
            )
        policy = config.get("maxmemory-policy", "noeviction")
        if policy != "noeviction":
            warnings["eviction_policy"] = (
                f"Redis maxmemory-policy is {policy}, not noeviction: when memory runs "
                "out it deletes keys, so enqueued jobs and dedup keys can vanish"
            )
        self._config_warnings = warnings
        for reason, sentence in warnings.items():
            log_event(
                "config_warning",
                level="warning",
                queue=None,
                job=None,
                job_id=None,
                attempt=None,
                reason=reason,
                error=sentence,
            )
        return dict(warnings)

    # -- reading -------------------------------------------------------------

    @translated
    def queue_counts(self, queue: str) -> QueueCounts:
        return self.jobs.counts(queue)

    @translated
    def group_counts(self, queue: str, *, limit: int = 50) -> QueueGroups:
        return self.jobs.group_counts(queue, limit)

    @translated
    def get_job(self, job_id: str) -> JobRecord | None:
        return self.jobs.get(job_id)

    @translated
    def list_jobs(self, queue: str, state: str, *, limit: int = 50, offset: int = 0) -> list[JobRecord]:
        check_state(state)
        return self.jobs.list_jobs(queue, state, limit, offset)

    @translated
    def pause_queue(self, queue: str) -> None:
        self.jobs.pause(queue)

    @translated
    def resume_queue(self, queue: str) -> None:
        self.jobs.resume(queue)

    @translated
    def set_group_weight(self, queue: str, group: str, weight: int) -> None:
        self.jobs.set_group_weight(queue, group, weight)

    @translated
    def stored_group_weights(self, queue: str) -> dict[str, int]:
        return self.jobs.group_weights(queue)

    # -- operator actions ----------------------------------------------------

    @translated
    def retry_job(self, job_id: str) -> bool:
        return self.jobs.retry_job(job_id)

    @translated
    def retry_failed(self, queue: str) -> int:
        return self.jobs.retry_failed(queue)

    @translated
    def promote_job(self, job_id: str) -> bool:
        """The delayed message, re-encoded for its queue without its eta (as :meth:`_promote` does), moves in
        one script call (``promote_job`` in jobs.lua), which re-checks that the job is still delayed with it."""
        found = self.jobs.delayed(job_id)
        if found is None:
            return False
        queue, rid, data = found
        try:
            stored = Message.decode(data)
        except DecodeError:
            moved = data  # the worker that fetches it dead-letters it, as it would have at its eta
        else:
            message = _fresh(stored).copy(queue_name=queue, options={"redis_message_id": rid})
            message.options.pop("eta", None)
            moved = message.encode()
        return self.jobs.promote_job(queue, job_id, rid, moved)

    @translated
    def signal_event(self, name: str, resolution: str, ttl: float) -> int:
        return self.jobs.signal(name, resolution, ttl)

    @translated
    def resolve_wait(self, job_id: str, name: str, *, timed_out: bool) -> str | None:
        return self.jobs.resolve_wait(job_id, name, timed_out=timed_out)

    @translated
    def delete_job(self, job_id: str) -> bool:
        return self.jobs.delete(job_id)

    # -- cancel ------------------------------------------------------------------

    @translated
    def cancel_job(self, job_id: str) -> str | None:
        return self.jobs.cancel(job_id)

    @translated
    def cancel_outcome(self, message: AnyMessage, error: str | None = None) -> bool:
        held = delivery_of(message)
        if held is None:
            return False
        rid, delivery = held
        if not self.jobs.cancelled(message.queue_name, rid, message.message_id, delivery, error):
            refused("cancel", q_name(message.queue_name), message.message_id)
            return False
        message.options[CANCELLED] = True
        return True

    @translated
    def cancel_requested(self, job_ids: list[str]) -> set[str]:
        return self.jobs.cancel_requested(job_ids)

    def cancel_listener(self) -> CancelListener | None:
        return self.jobs.cancel_listener()

    # -- Dramatiq's admin helpers (tests) ---------------------------------------

    @translated
    def flush(self, queue_name: str) -> None:
        if not self.cluster:
            super().flush(queue_name)
        self.jobs.flush(queue_name)

    @translated
    def flush_all(self) -> None:
        super().flush_all()

    def join(self, queue_name: str, *, interval: int = 100, timeout: int | None = None) -> None:
        """Dramatiq's join (tests): until no message of the queue or its delay queue is stored."""
        if not self.cluster:
            super().join(queue_name, interval=interval, timeout=timeout)
            return
        deadline = timeout and time.monotonic() + timeout / 1000
        while self.jobs.stored(queue_name):
            if deadline and time.monotonic() >= deadline:
                raise QueueJoinTimeout(queue_name)
            time.sleep(interval / 1000)


def _fresh(message: Message[Any]) -> Message[Any]:
    """The message as it is stored: without what belonged to the delivery it came with."""
    options = {k: v for k, v in message.options.items() if k not in DELIVERY_OPTIONS}
    return dataclasses.replace(message, options=options)
