"""The production broker: Dramatiq's RedisBroker, with conveyor's job records and delivery fence.

It keeps Dramatiq's key layout and replaces its Lua with ``jobs.lua``, so
that a keyed enqueue, a fetch, a start, an outcome, a promotion and a
recovery each change queue and job record in one atomic step, on the
server's clock, fenced by the job's delivery number.

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
    MAX_GROUPS,
    MAX_PRIORITY,
    AnyMessage,
    CancelListener,
    Capabilities,
    ConveyorBroker,
    EnqueueItem,
    FinalFailure,
    GroupCounts,
    JobRecord,
    JobRef,
    PoolOwner,
    QueueCounts,
    QueueGroups,
    announce_unknown_job,
    as_message,
    busiest_first,
    check_state,
    log_delivery_error,
    malformed_error,
    priority_of,
    unknown_job_error,
)
from conveyor.brokers.redis.cluster import REDIRECTS, node_client, on_node, refresh
from conveyor.brokers.redis.consumer import DELIVERY_OPTIONS, AckBuffer, RedisConsumer, delivery_of
from conveyor.brokers.redis.deliveries import Deliveries, Retry, refused
from conveyor.brokers.redis.keys import Keys
from conveyor.brokers.redis.records import record_from_hash
from conveyor.brokers.redis.replies import text
from conveyor.brokers.redis.scripts import JOBS
from conveyor.brokers.redis.sending import MaybeSent, SendFailed, call_once
from conveyor.errors import (
    BrokerRejected,
    BrokerUnavailable,
    BrokerUnreachable,
    ConfigurationError,
    EnqueueOutcomeUnknown,
)
from conveyor.events import PARK
from conveyor.logs import log_error, log_event
from conveyor.redis_client import UNAVAILABLE, is_cluster, is_unavailable, translated
from conveyor.redis_client import client as redis_client

if TYPE_CHECKING:
    from collections.abc import Callable

    from conveyor.brokers.fleet.base import FleetStore
    from conveyor.brokers.rollup.base import RollupStore
    from conveyor.settings import Settings

_MS = 1000  # settings are in seconds, the script counts milliseconds

#: The jobs.lua commands that write this worker's heartbeat (they call heartbeat()).
HEARTBEATS = frozenset({"fetch", "start", "acks", "nack", "retry", "promote", "requeue", "release", "maintain"})

#: Failed jobs moved per script call by retry_failed: each call blocks Redis
#: while it runs, so a queue with many failures is retried in slices.
RETRY_BATCH = 500

#: A named group's oldest wait is read among this many of its first jobs by rank (group_counts).
OLDEST_AMONG = 16

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
            self.client, self.keys.shared, dedup_keys=self.dedup_keys, enqueued_keys=self.enqueued_keys
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
        self.retention_ms = int(retention * _MS)
        self.unknown_job_delay = settings.unknown_job_delay
        #: Seconds of waiting one priority level is worth (jobs.lua: a rank is ready_at - priority x this).
        self.priority_aging = settings.priority_aging_seconds
        #: A pause between recovery passes (anyone's) longer than this means Redis or every worker was away:
        #: recovery waits a heartbeat timeout before declaring anyone dead (see maintain in jobs.lua).
        self.recovery_gap_ms = int(max(heartbeat_timeout / 2, 3 * settings.maintenance_interval) * _MS)
        #: An idle consumer's BLPOP never outlasts half the socket timeout (or it would read as a timeout).
        self.wait_cap = max(0.1, settings.redis_socket_timeout / 2)
        #: On Redis Cluster every key of a queue carries the queue as its hash tag (see keys.py).
        self.cluster = is_cluster(client)
        self.keys = Keys(namespace, cluster=self.cluster)
        self._registered: set[str] = set()  # queues this process recorded in keys.queues (cluster)
        #: Runs the final-failure hook of a job the broker itself fails (an undecodable message), as on Postgres.
        self._on_dead = on_dead
        self._jobs = self.client.register_script(JOBS)
        #: (replicas, timeout ms) each enqueue and claim WAITs for; None: no WAIT (redis_wait_replicas = 0).
        self.replicas = (
            (settings.redis_wait_replicas, int(settings.redis_wait_timeout * _MS))
            if settings.redis_wait_replicas
            else None
        )
        #: Script calls an enqueue may make: a lost reply's call is repeated (exactly: see _send_enqueue).
        self.enqueue_attempts = 1 + settings.redis_retries
        #: ms jobs.lua keeps a duplicate's answer, so a repeated call answers the same: twice the longest a
        #: repeat can come after the first call (each attempt's connect, reply and WAIT timeouts and backoff
        #: capped at 2 s), at least a minute.
        attempt = settings.redis_connect_timeout + settings.redis_socket_timeout + settings.redis_wait_timeout + 2.0
        self.answer_ttl_ms = int(max(60.0, 2 * self.enqueue_attempts * attempt) * _MS)
        #: What this process holds: fetched deliveries not settled yet, and retries their acks will write.
        self.deliveries = Deliveries()
        self.acks = AckBuffer(self)
        self._lock = threading.Lock()
        self._consumed: set[str] = set()
        self._config_warnings: dict[str, str] | None = None
        #: A queue's consumer and its delay queue's start at once: one of them reads the config and logs.
        self._config_lock = threading.Lock()
        #: monotonic time a script call that heartbeats (see HEARTBEATS) was sent, of the last that succeeded.
        self._beat_at: float | None = None

    # -- plumbing -----------------------------------------------------------

    def _call(self, command: str, queue: str, *args: Any, client: Any = None) -> Any:
        sent = time.monotonic()
        scope = self.keys.scope(queue).ns
        result = self._jobs(keys=[scope], args=[command, queue, self.broker_id, *args], client=client)
        if command in HEARTBEATS and client is None:
            with self._lock:  # the server wrote the heartbeat after `sent`
                self._beat_at = sent if self._beat_at is None else max(self._beat_at, sent)
        return result

    def heartbeat_age(self) -> float | None:
        beat = self._beat_at
        return None if beat is None else time.monotonic() - beat

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
                consumed = bool(self._consumed)
            left = self.deliveries.any_held()
            if consumed and not left:
                self._leave()
        except Exception as exc:
            log_error(f"could not hand back held jobs, recovery will: {type(exc).__name__}: {exc}")
        if self.cluster:
            # Each node's connections are dropped, the client stays usable (a later call reconnects),
            # as a plain client's close() leaves it; the cluster client's close() would forget the topology.
            for node in self._cluster_nodes():
                if node.redis_connection is not None:
                    node.redis_connection.connection_pool.disconnect()
            return
        self.client.close()
        self.client.connection_pool.disconnect()

    def _cluster_nodes(self) -> list[Any]:
        cluster: Any = self.client
        return list(cluster.get_nodes())

    def _leave(self) -> None:
        """Forget this worker's heartbeat (on a cluster: in each consumed queue's scope, one call each)."""
        if not self.cluster:
            self._call("leave", "")
            return
        with self._lock:
            queues = sorted({q_name(name) for name in self._consumed})
        for queue in queues:
            self._call("leave", queue)

    def dedup_keys(self, key: str) -> list[str]:
        """Where a dedup key may be held: the namespace's entry, or on a cluster each known queue's."""
        if not self.cluster:
            return [self.keys.dedup(key)]
        return [self.keys.scope(q).dedup(key) for q in self.known_queues()]

    def enqueued_keys(self) -> list[str]:
        """The hashes jobs.lua's enqueue counts new jobs in: the namespace's, or on a cluster each known
        queue's plus the shared one producers wrote before the count moved into the script (their history,
        and their counts during a rolling deploy: a total never goes down)."""
        if not self.cluster:
            return [self.keys.enqueued]
        return [f"{self.keys.shared}:fleet:enqueued", *(self.keys.scope(q).enqueued for q in self.known_queues())]

    def known_queues(self) -> list[str]:
        """Every queue declared here, and on a cluster every queue anyone enqueued to (keys.queues)."""
        names = set(self.queues)
        if self.cluster:
            names |= {text(q) for q in self.client.smembers(self.keys.queues)}
        return sorted(q_name(q) for q in names)

    # -- the consumer's calls (RedisConsumer and AckBuffer use these and ``deliveries``, nothing private) -----

    def fetch(self, name: str, room: int) -> list[tuple[str, bytes, int, str, int | None]]:
        """Fetch up to ``room`` messages of list ``name``: (rid, data, delivery, note, wait ms or None) each.

        Each is held (``deliveries``) inside the same critical section the
        release pass uses, so none is handed back while this worker has it.
        """
        with self.deliveries.fetching(name):
            cap = self.group_caps.get(q_name(name)) or 0  # held jobs of one named group, fleet-wide (0: no cap)
            rows = (
                self._call("fetch", name, room, int(self.priority_aging * _MS), cap)
                if self.replicas is None
                else self._fetch_replicated(name, room, cap)
            )
            out = []
            for i in range(0, len(rows), 5):
                rid = rows[i].decode()
                delivery = int(rows[i + 2])
                self.deliveries.hold(name, rid, delivery)
                wait = rows[i + 4]
                out.append(
                    (
                        rid,
                        rows[i + 1],
                        delivery,
                        rows[i + 3].decode(),
                        int(wait) if wait not in (b"", "", None) else None,
                    )
                )
        return out

    def send_acks(self, name: str, items: list[str | int]) -> list[Any]:
        """Write buffered acks of list ``name`` ((rid, job id, delivery) flat) in one script call; returns the
        job ids whose ack was refused (superseded deliveries). Raises if Redis did not take them."""
        return list(self._call("acks", name, self.retention_ms, len(items) // 3, *items))

    def write_retry(self, name: str, rid: str, job_id: str, delivery: int, retry: Retry) -> None:
        """A failed delivery's outcome and its next run (``retry``), in one fenced script call; unholds it."""
        done = self._call(
            "retry",
            name,
            rid,
            job_id,
            delivery,
            retry.rid,
            retry.data,
            retry.delay,
            retry.error,
            retry.event,
            retry.resume,
        )
        self.deliveries.settle(name, [(rid, delivery)])
        if done == -1:
            refused("retry", q_name(name), job_id)

    def write_nack(self, name: str, rid: str, job_id: str, delivery: int, error: str) -> None:
        """A delivery failed for good: fenced, it fails the job; unholds it."""
        done = self._call("nack", name, rid, job_id, delivery, self.retention_ms, storable(error))
        self.deliveries.settle(name, [(rid, delivery)])
        if done == -1:
            refused("failure", q_name(name), job_id)

    def hand_back(self, name: str, pairs: list[tuple[str, int]]) -> None:
        """(rid, delivery) pairs go back to their queue as new deliveries, unattempted; unholds them."""
        if not pairs:
            return
        self._call("requeue", name, *(x for pair in pairs for x in pair))
        self.deliveries.settle(name, pairs)

    def _fetch_replicated(self, name: str, room: int, cap: int) -> Any:
        """The claim, then WAIT on the same connection: a claim replicas lack is not started.

        Its rows are not recorded as held, so this worker's orphan pass hands
        them back (under a new delivery number), and the error restarts the consumer.
        """
        assert self.replicas is not None
        sent = time.monotonic()
        scope = self.keys.scope(name).ns
        # On a cluster, WAIT counts the replicas of the node it reaches: the pipeline goes to the slot's node.
        client = on_node(self.client, scope) if self.cluster else self.client
        with client.pipeline(transaction=False) as pipe:
            self._jobs(
                keys=[scope],
                args=["fetch", name, self.broker_id, room, int(self.priority_aging * _MS), cap],
                client=pipe,
            )
            pipe.execute_command("WAIT", *self.replicas)  # type: ignore[no-untyped-call]
            try:
                rows, acked = pipe.execute()
            except REDIRECTS as exc:  # the slot moved (a failover): nothing ran; the consumer restarts
                refresh(self.client)
                raise redis.ConnectionError(f"the queue's slot moved: {type(exc).__name__}") from exc
            except UNAVAILABLE:
                if self.cluster:  # the node may be gone: the consumer's next fetch asks the new owner
                    refresh(self.client)
                raise
        with self._lock:
            self._beat_at = sent if self._beat_at is None else max(self._beat_at, sent)
        if int(acked) < self.replicas[0]:
            raise redis.TimeoutError(f"WAIT: {acked} of {self.replicas[0]} replica(s) had the claim in time")
        return rows

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
        message = as_message(message).copy(options={"redis_message_id": str(uuid.uuid4())})
        if delay_ms is not None:
            message = message.copy(queue_name=dq_name(message.queue_name), options={"eta": current_millis() + delay_ms})
        return message

    def _enqueue_many(self, items: list[EnqueueItem], *, dedup_ttl: float) -> list[tuple[Message[Any], JobRef]]:
        """The whole batch in one script call: all of it is enqueued or none, and the error says which.

        On Redis Cluster one script call reaches one queue's slot: a batch spanning queues is one call
        per queue, each all or nothing; a call failing after another succeeded is an outcome unknown.
        """
        if not self.cluster:
            return self._enqueue_scope(items, dedup_ttl=dedup_ttl, scope=self.namespace)
        by_queue: dict[str, list[int]] = {}
        for i, item in enumerate(items):
            by_queue.setdefault(q_name(item.message.queue_name), []).append(i)
        out: list[tuple[Message[Any], JobRef] | None] = [None] * len(items)
        done: list[str] = []
        for queue, positions in by_queue.items():
            if queue not in self._registered:
                with contextlib.suppress(redis.RedisError):  # lookups by job id read it; the enqueue may go on
                    self.client.sadd(self.keys.queues, queue)
                    self._registered.add(queue)
            try:
                part = self._enqueue_scope(
                    [items[i] for i in positions], dedup_ttl=dedup_ttl, scope=self.keys.scope(queue).ns
                )
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
        self, items: list[EnqueueItem], *, dedup_ttl: float, scope: str
    ) -> list[tuple[Message[Any], JobRef]]:
        prepared: list[tuple[Message[Any], EnqueueItem]] = []
        args: list[Any] = ["enqueue", "", self.broker_id, int(dedup_ttl * _MS), len(items)]
        for item in items:
            message = self._prepare(item.message, item.delay_ms)
            self.emit_before("enqueue", message, item.delay_ms)
            prepared.append((message, item))
            args += [
                message.queue_name,
                message.options["redis_message_id"],
                message.message_id,
                message.encode(),
                message.actor_name,
                item.key or "",
                "" if item.delay_ms is None else int(item.delay_ms),
                storable(message.options.get("last_error", "")),
                priority_of(message),
                str(message.options.get("group") or ""),
            ]
        args += [self.answer_ttl_ms, int(self.priority_aging * _MS)]  # aging: a named group's rank (jobs.lua)
        results = self._send_enqueue(args, len(items), scope)
        out: list[tuple[Message[Any], JobRef]] = []
        for i, (message, item) in enumerate(prepared):
            ref = JobRef(text(results[2 * i]), bool(int(results[2 * i + 1])))
            if not ref.deduplicated:
                self.emit_after("enqueue", message, item.delay_ms)
            out.append((message, ref))
        return out

    def _send_enqueue(self, args: list[Any], count: int, scope: str) -> Any:
        """The enqueue's script call, repeated (up to ``redis_retries`` times) only where that is exact.

        A call that may have reached Redis is repeated as it was: the script
        finds each job it already wrote by its rid, so a repeat that gets a
        reply reports the batch exactly, whichever call applied it. A call
        that cannot have been sent raises BrokerUnavailable; one that may
        have been applied and was never answered, EnqueueOutcomeUnknown.
        """
        maybe: SendFailed | None = None
        last: SendFailed
        for attempt in range(self.enqueue_attempts):
            if attempt:
                time.sleep(min(2.0, 0.1 * 2 ** (attempt - 1)))
            try:
                return call_once(self._node_of(scope), self._jobs, [scope], args, replicas=self.replicas)
            except SendFailed as exc:
                last = exc
                if self.cluster:  # the node may be gone and its slots served by a promoted replica
                    refresh(self.client)
                if isinstance(exc, MaybeSent):
                    maybe = exc
            except redis.RedisError as exc:
                # An answer. Refused before any write (OOM, BUSY, LOADING, READONLY: the script writes
                # nothing before its first write is allowed) is nothing enqueued by this call; anything
                # else stopped the script part-way, and what it wrote before stays.
                if maybe is None and (is_unavailable(exc) or isinstance(exc, _REFUSED_BEFORE_WRITING)):
                    raise BrokerUnavailable(
                        f"Redis refused the enqueue, nothing was enqueued: {_summary(exc)}"
                    ) from exc
                why = "an earlier call was never answered" if maybe else "the script may have stopped part-way"
                raise EnqueueOutcomeUnknown(
                    f"Redis answered the enqueue of {count} job(s) with an error ({_summary(exc)}) and {why}: "
                    f"they may have been enqueued; enqueue them again only with a key"
                ) from exc
        if maybe is not None:
            raise EnqueueOutcomeUnknown(
                f"Redis did not answer the enqueue of {count} job(s) ({maybe}): the request reached it or may "
                f"have, so they may have been enqueued; enqueue them again only with a key"
            ) from maybe.cause
        raise BrokerUnavailable(f"Redis is unavailable, nothing was enqueued: {last}") from last.cause

    def _node_of(self, scope: str) -> Any:
        """The client ``call_once`` sends ``scope``'s script call on: the one client, or its slot's node's."""
        return node_client(self.client, scope) if self.cluster else self.client

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
            resume = ready.encode()
        self.emit_before("enqueue", new, delay)
        retry = Retry(
            new.options["redis_message_id"],
            new.encode(),
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
            done = self._call("promote", origin, rid, message.message_id, delivery, moved.encode())
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
                result = self._call(
                    "start", queue, rid, message.message_id, delivery, self.retention_ms, len(acks) // 3, *acks
                )
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
        self.acks.sent(queue, acks, result[1:])
        attempt = int(result[0])
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
                error = storable(message.options.get("last_error") or "")
                claimed = int(self._call("claim_final", message.queue_name, rid, message.message_id, delivery, error))
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
            done = self._call(
                "retry",
                name,
                rid,
                message.message_id,
                delivery,
                str(uuid.uuid4()),
                data,
                int(self.unknown_job_delay * _MS),
                storable(unknown_job_error(message.actor_name)),
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
        job_key = self.keys.scope(message.queue_name).job(message.message_id)
        current_rid, current = self.client.hmget(job_key, ["rid", "delivery"])
        return current_rid is not None and text(current_rid) == rid and current is not None and int(current) == delivery

    def fail_malformed(self, name: str, rid: str, delivery: int, exc: Exception) -> None:
        """A fetched message that cannot be decoded goes to the dead letters; its job, if its id could be
        read, fails with it (counted once) and its final-failure hook runs with no payload, as on Postgres."""
        error = malformed_error(exc)
        claimed, job_id, job = self._call("poison", name, rid, delivery, self.retention_ms, storable(error))
        self.deliveries.settle(name, [(rid, delivery)])
        queue = q_name(name)
        if not job_id:
            log_error(f"malformed message {rid} moved to the dead letters: {error}", level="error", queue=queue)
            return
        job_id, job = text(job_id), text(job)
        log_event("failed", level="error", queue=queue, job=job or None, job_id=job_id, attempt=None, error=error)
        if int(claimed) != 1 or self._on_dead is None:
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
        # On a cluster each queue's scope has its own heartbeats, acks sets and markers: one pass per queue.
        groups = [sorted(self.queues)] if not self.cluster else [[q] for q in sorted(self.queues)]
        recovered: dict[str, list[str]] = {}
        for group in groups:
            names = group + [dq_name(q) for q in group]
            rows = self._call(
                "maintain",
                group[0] if self.cluster else "",
                self.heartbeat_timeout,
                self.retention_ms,
                self.dead_message_ttl,
                self.recovery_gap_ms,
                *names,
            )
            for i in range(0, len(rows), 2):
                recovered.setdefault(rows[i].decode(), []).append(rows[i + 1].decode())
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
                ids = self._call("release", name, *held)
            if ids:
                released[q_name(name)] = [i.decode() for i in ids]
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
        try:
            config: dict[str, str] = {}
            for name in ("appendonly", "save", "maxmemory-policy"):
                config.update({text(k): text(v) for k, v in self.client.config_get(name).items()})
        except redis.ResponseError:  # CONFIG is renamed or forbidden (managed Redis): nothing to say
            self._config_warnings = {}
            return {}
        except redis.RedisError as exc:
            raise BrokerUnreachable(f"Redis is unavailable: {type(exc).__name__}: {exc}") from exc
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
        keys = self.keys.scope(queue)
        with self.client.pipeline(transaction=False) as pipe:
            for state in ("waiting", "delayed", "active", "failed", "cancelled"):
                pipe.zcard(keys.index(queue, state))
            pipe.zcard(keys.index(queue, "awaiting"))
            pipe.hmget(keys.totals(queue), "completed", "failed")
            pipe.sismember(keys.paused, queue)
            # The waiting index is scored by when each job became waiting: the first is the oldest.
            pipe.zrange(keys.index(queue, "waiting"), 0, 0, withscores=True)
            pipe.zrange(keys.index(queue, "active"), 0, -1)
            (
                waiting,
                delayed,
                active,
                failed,
                cancelled,
                awaiting,
                (completed_total, failed_total),
                paused,
                oldest,
                claimed,
            ) = pipe.execute()
        # Fetched jobs read active at once; one is running once its current delivery started (jobs.lua, start).
        with self.client.pipeline(transaction=False) as pipe:
            for job_id in claimed:
                pipe.hmget(keys.job(text(job_id)), "delivery", "started_delivery")
            deliveries = pipe.execute()
        running = sum(1 for current, started in deliveries if current is not None and current == started)
        return QueueCounts(
            queue,
            waiting,
            delayed,
            active,
            failed,
            int(completed_total or 0),
            int(failed_total or 0),
            bool(paused),
            oldest[0][1] / _MS if oldest else None,
            running,
            cancelled,
            awaiting=awaiting,
        )

    @translated
    def group_counts(self, queue: str, *, limit: int = 50) -> QueueGroups:
        """From the queue's keys: the ring and the held-slots hash name the groups; a group's waiting jobs are
        its sorted set (by rank) and any left in an earlier release's list, which run first. Its oldest wait:
        that list's head, else the longest waiting (by the waiting index) of its set's first few by rank."""
        keys = self.keys.scope(queue)
        with self.client.pipeline(transaction=False) as pipe:
            pipe.lrange(keys.groups(queue), 0, -1)
            pipe.hgetall(keys.running(queue))
            ring, running = pipe.execute()
        held = {text(g): int(n) for g, n in running.items() if int(n) > 0}
        names = sorted(({text(g) for g in ring} | set(held)) - {""})
        with self.client.pipeline(transaction=False) as pipe:
            for name in names:
                pipe.llen(keys.group(queue, name))
                pipe.zcard(keys.group_ready(queue, name))
            sizes = pipe.execute()
        lengths = [sizes[i] + sizes[i + 1] for i in range(0, len(sizes), 2)]
        found = [GroupCounts(g, n, held.get(g, 0)) for g, n in zip(names, lengths) if n or held.get(g)]
        shown = busiest_first(found, min(limit, MAX_GROUPS))
        waiting = [g for g in shown if g.waiting]
        with self.client.pipeline(transaction=False) as pipe:
            for g in waiting:
                pipe.lindex(keys.group(queue, g.group), 0)
                pipe.zrange(keys.group_ready(queue, g.group), 0, OLDEST_AMONG - 1)
            found_heads = pipe.execute()
        heads = [[old] if old else new for old, new in zip(found_heads[::2], found_heads[1::2])]
        with self.client.pipeline(transaction=False) as pipe:
            for rids in heads:
                for rid in rids:
                    pipe.hget(keys.messages(queue), rid)
            messages = iter(pipe.execute())
        ids = [[_message_id(next(messages)) for _ in rids] for rids in heads]
        with self.client.pipeline(transaction=False) as pipe:
            for group_ids in ids:
                for job_id in group_ids:
                    pipe.zscore(keys.index(queue, "waiting"), job_id or "")
            found_scores = iter(pipe.execute())
        scores = [[s for _ in group_ids if (s := next(found_scores)) is not None] for group_ids in ids]
        since = {g.group: min(s) / _MS for g, s in zip(waiting, scores) if s}
        groups = [dataclasses.replace(g, oldest_waiting_at=since.get(g.group)) for g in shown]
        return QueueGroups(queue, groups, len(found))

    @translated
    def get_job(self, job_id: str) -> JobRecord | None:
        found = self._find(job_id)
        return None if found is None else record_from_hash(job_id, found[1])

    def _find(self, job_id: str) -> tuple[Keys, dict[Any, Any]] | None:
        """The job's record and the keys of its scope; on a cluster, looked up in each known queue's scope."""
        if not self.cluster:
            row: dict[Any, Any] = self.client.hgetall(self.keys.job(job_id))
            return (self.keys, row) if row else None
        scopes = [self.keys.scope(q) for q in self.known_queues()]
        with self.client.pipeline(transaction=False) as pipe:
            for keys in scopes:
                pipe.hgetall(keys.job(job_id))
            rows = pipe.execute()
        for keys, row in zip(scopes, rows):
            if row:
                return keys, row
        return None

    @translated
    def list_jobs(self, queue: str, state: str, *, limit: int = 50, offset: int = 0) -> list[JobRecord]:
        check_state(state)
        keys = self.keys.scope(queue)
        ids = self.client.zrevrange(keys.index(queue, state), offset, offset + limit - 1)
        with self.client.pipeline(transaction=False) as pipe:
            for job_id in ids:
                pipe.hgetall(keys.job(text(job_id)))
            rows = pipe.execute()
        return [r for r in (record_from_hash(text(i), row) for i, row in zip(ids, rows)) if r]

    @translated
    def pause_queue(self, queue: str) -> None:
        self.client.sadd(self.keys.scope(queue).paused, queue)

    @translated
    def resume_queue(self, queue: str) -> None:
        self.client.srem(self.keys.scope(queue).paused, queue)

    # -- operator actions ----------------------------------------------------

    def _job_queue(self, job_id: str) -> str | None:
        found = self._find(job_id)
        queue = None if found is None else found[1].get(b"queue")
        return text(queue) if queue else None

    @translated
    def retry_job(self, job_id: str) -> bool:
        queue = self._job_queue(job_id)
        # The script re-checks state and queue: the record may change between the two calls.
        return queue is not None and bool(self._call("retry_job", queue, job_id))

    @translated
    def retry_failed(self, queue: str) -> int:
        total = 0
        while True:
            retried, looked_at = self._call("retry_failed", queue, RETRY_BATCH)
            total += int(retried)
            if int(looked_at) < RETRY_BATCH:
                return total

    @translated
    def promote_job(self, job_id: str) -> bool:
        """The delayed message, re-encoded for its queue without its eta (as :meth:`_promote` does), moves in
        one script call (``promote_job`` in jobs.lua), which re-checks that the job is still delayed with it."""
        found = self._find(job_id)
        if found is None:
            return False
        keys, row = found
        stored_queue, stored_rid, state = row.get(b"queue"), row.get(b"rid"), row.get(b"state")
        if stored_queue is None or stored_rid is None or state not in (b"delayed", b"awaiting"):
            return False
        queue, rid = text(stored_queue), text(stored_rid)
        data = self.client.hget(keys.scope(queue).messages(dq_name(queue)), rid)
        if data is None:
            return False
        data = data if isinstance(data, bytes) else data.encode()
        try:
            stored = Message.decode(data)
        except DecodeError:
            moved = data  # the worker that fetches it dead-letters it, as it would have at its eta
        else:
            message = _fresh(stored).copy(queue_name=queue, options={"redis_message_id": rid})
            message.options.pop("eta", None)
            moved = message.encode()
        return bool(self._call("promote_job", queue, job_id, rid, moved))

    @translated
    def signal_event(self, name: str, resolution: str, ttl: float) -> int:
        """One script call (``signal`` in jobs.lua): the awaiting jobs move, the signal is kept. On a cluster
        each queue's scope keeps its own waiters and kept signals: one call per known queue."""
        ttl_ms = max(1, int(ttl * _MS))
        if not self.cluster:
            return int(self._call("signal", "", name, resolution, ttl_ms))
        return sum(int(self._call("signal", q, name, resolution, ttl_ms)) for q in self.known_queues())

    @translated
    def resolve_wait(self, job_id: str, name: str, *, timed_out: bool) -> str | None:
        """One script call (``resolve_wait`` in jobs.lua): read, or record insert-first."""
        queue = self._job_queue(job_id) if self.cluster else ""
        found = self._call("resolve_wait", queue or "", job_id, name, "1" if timed_out else "0")
        return None if found is None else text(found)

    @translated
    def delete_job(self, job_id: str) -> bool:
        queue = self._job_queue(job_id)
        return queue is not None and bool(self._call("delete", queue, job_id, self.retention_ms))

    # -- cancel ------------------------------------------------------------------

    @translated
    def cancel_job(self, job_id: str) -> str | None:
        queue = self._job_queue(job_id)
        if queue is None:
            return None
        # The script re-checks the queue: "" when the record changed or went in between. The call's own id:
        # redis-py repeats a call whose reply was lost, and the repeat must answer what the first one did
        # (not "finished" for the job that first call cancelled).
        call = str(uuid.uuid4())
        outcome = text(
            self._call("cancel", queue, job_id, self.retention_ms, self.keys.cancels, call, self.answer_ttl_ms)
        )
        return outcome or None

    @translated
    def cancel_outcome(self, message: AnyMessage, error: str | None = None) -> bool:
        held = delivery_of(message)
        if held is None:
            return False
        rid, delivery = held
        fence = self._call(
            "cancelled", message.queue_name, rid, message.message_id, delivery, self.retention_ms, storable(error)
        )
        if int(fence) != 1:
            refused("cancel", q_name(message.queue_name), message.message_id)
            return False
        message.options[CANCELLED] = True
        return True

    @translated
    def cancel_requested(self, job_ids: list[str]) -> set[str]:
        if not job_ids:
            return set()
        if not self.cluster:
            return {text(i) for i in self._call("cancel_requested", "", *job_ids)}
        asked: set[str] = set()
        for job_id in job_ids:  # each record is in its own queue's scope
            queue = self._job_queue(job_id)
            if queue is not None:
                asked |= {text(i) for i in self._call("cancel_requested", queue, job_id)}
        return asked

    def cancel_listener(self) -> CancelListener | None:
        return _RedisCancels(self.client, self.keys.cancels)

    # -- Dramatiq's admin helpers (tests) ---------------------------------------

    @translated
    def flush(self, queue_name: str) -> None:
        keys = self.keys.scope(queue_name)
        queue = q_name(queue_name)
        if not self.cluster:
            super().flush(queue_name)
        else:
            # Dramatiq's purge script builds its keys from the bare namespace: on a cluster, per scope.
            for name in (queue, dq_name(queue_name)):
                self.client.delete(keys.queue(name), keys.messages(name))
        # The priority levels' lists (jobs.lua ready_push), which Dramatiq's purge does not know.
        levels = (keys.level(queue, p) for p in range(1, MAX_PRIORITY + 1))
        self.client.delete(keys.levels(queue), keys.ranks(queue), *levels)
        # The groups' ready sets (and older lists) and their ring (their messages are gone with the queue's hash).
        groups = {text(g) for g in self.client.lrange(keys.groups(queue), 0, -1)} - {""}
        ready = [key for g in groups for key in (keys.group(queue, g), keys.group_ready(queue, g))]
        self.client.delete(keys.groups(queue), keys.group_stamp(queue), *ready)

    @translated
    def flush_all(self) -> None:
        super().flush_all()

    def join(self, queue_name: str, *, interval: int = 100, timeout: int | None = None) -> None:
        """Dramatiq's join (tests): until no message of the queue or its delay queue is stored."""
        if not self.cluster:
            super().join(queue_name, interval=interval, timeout=timeout)
            return
        keys = self.keys.scope(queue_name)
        deadline = timeout and time.monotonic() + timeout / 1000
        while sum(self.client.hlen(keys.messages(n)) for n in (q_name(queue_name), dq_name(queue_name))):
            if deadline and time.monotonic() >= deadline:
                raise QueueJoinTimeout(queue_name)
            time.sleep(interval / 1000)


def storable(text: str | None) -> str:
    """Any error text as valid UTF-8 (a lone surrogate would make the script call fail); NUL is fine in Redis."""
    return (text or "").encode("utf-8", "backslashreplace").decode("utf-8")


#: Error replies of a script refused at its first write, before it changed anything (redis-py names them
#: by class: OOM, READONLY; a LOADING reply is a BusyLoadingError, which is_unavailable counts already).
_REFUSED_BEFORE_WRITING = (redis.exceptions.OutOfMemoryError, redis.exceptions.ReadOnlyError)


def _message_id(data: bytes | None) -> str | None:
    """The job id of an encoded message; None when there is none or it cannot be decoded."""
    if not data:
        return None
    try:
        return Message.decode(data).message_id
    except Exception:  # an undecodable message: the worker that fetches it dead-letters it
        return None


def _summary(exc: BaseException) -> str:
    """redis-py's error, first line only (a pipeline's or a script's text names the whole command)."""
    lines = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {lines[0][:300] if lines else ''}"


def _fresh(message: Message[Any]) -> Message[Any]:
    """The message as it is stored: without what belonged to the delivery it came with."""
    options = {k: v for k, v in message.options.items() if k not in DELIVERY_OPTIONS}
    return dataclasses.replace(message, options=options)


class _RedisCancels:
    """A pub/sub subscription to the cancel channel (keys.py ``Keys.cancels``)."""

    def __init__(self, client: Any, channel: str) -> None:
        self.pubsub = client.pubsub(ignore_subscribe_messages=True)
        self.pubsub.subscribe(channel)

    def wait(self, timeout: float) -> list[str]:
        ids: list[str] = []
        message = self.pubsub.get_message(timeout=timeout)
        while message is not None:
            if message.get("type") == "message":
                ids.append(text(message["data"]))
            message = self.pubsub.get_message(timeout=0)
        return ids

    def close(self) -> None:
        self.pubsub.close()
