"""The one class that talks to Redis for the broker: :class:`Jobs`.

It owns the script (``jobs.lua`` beside it, loaded once at import and
registered on the client: EVALSHA, reloaded after a restart) and every
command the broker sends about jobs: the script's calls (enqueue, fetch,
start, outcomes, promotions, recovery, operator actions, cancel, waits),
the reads of job records, indexes, queues and groups, the dedup and
enqueued-count keys the fleet registry reads, this worker's heartbeat,
the cancel channel and the wake-up list. Key names come from ``keys.py``;
every key of a call is built under one queue's scope (see its module doc).

The broker (:mod:`.broker`, Dramatiq's adapter) turns Dramatiq's calls into
calls of this class and keeps what a process holds (``deliveries.py``); the
consumer reaches Redis through the broker's documented calls and this
class's :meth:`Jobs.wait`. Its methods return Redis's answers decoded, and
raise redis-py's errors: the broker's public methods translate them
(``conveyor.redis_client.translated``), and the enqueue's are translated
here, where the outcome of a lost reply must be exact (:meth:`Jobs.send_enqueue`).

Every write that belongs to one delivery of a job (start, outcome, retry,
final-failure claim, promotion, cancel) names the delivery number its
fetch returned; the script refuses it (``-1``) once that delivery is
superseded.
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading
import time
import uuid
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

import redis
from dramatiq import Message
from dramatiq.common import dq_name, q_name

from conveyor.brokers.base import (
    MAX_GROUPS,
    MAX_PRIORITY,
    GroupCounts,
    JobRecord,
    JobRef,
    QueueCounts,
    QueueGroups,
    busiest_first,
)
from conveyor.brokers.redis.cluster import REDIRECTS, node_client, on_node, refresh
from conveyor.brokers.redis.keys import Keys
from conveyor.brokers.redis.records import record_from_hash
from conveyor.brokers.redis.replies import text
from conveyor.brokers.redis.sending import MaybeSent, SendFailed, call_once
from conveyor.errors import BrokerUnavailable, BrokerUnreachable, EnqueueOutcomeUnknown
from conveyor.redis_client import UNAVAILABLE, is_cluster, is_unavailable

if TYPE_CHECKING:
    from conveyor.brokers.redis.deliveries import Retry
    from conveyor.settings import Settings

#: Every command that changes queue and job record together (see its header).
SCRIPT = (Path(__file__).with_name("jobs.lua")).read_text()

_MS = 1000  # settings are in seconds, the script counts milliseconds

#: The jobs.lua commands that write this worker's heartbeat (they call heartbeat()).
HEARTBEATS = frozenset({"fetch", "start", "acks", "nack", "retry", "promote", "requeue", "release", "maintain"})

#: Failed jobs moved per script call by retry_failed: each call blocks Redis
#: while it runs, so a queue with many failures is retried in slices.
RETRY_BATCH = 500

#: A named group's oldest wait is read among this many of its first jobs by rank (group_counts).
OLDEST_AMONG = 16

#: A fetched row: (rid, encoded message, delivery, note, ms until due or None).
Fetched = tuple[str, bytes, int, str, int | None]


class NewJob(NamedTuple):
    """One job to enqueue, as the broker builds it from a prepared message (``RedisBroker._enqueue_scope``)."""

    #: The list it goes to: its queue, or its delay queue (``$queue.DQ``) when delayed.
    queue_name: str
    #: The message's redis id (``redis_message_id``): a repeated call finds the job it already wrote by it.
    rid: str
    id: str
    #: The Dramatiq message, encoded.
    message: bytes
    job: str
    #: "" for none.
    key: str
    #: ms until it may run, "" for none.
    delay: int | str
    error: str
    #: 0..9, higher first.
    priority: int
    #: Its fair-share group ("": the default group).
    group: str


def storable(text: str | None) -> str:
    """Any error text as valid UTF-8 (a lone surrogate would make the script call fail); NUL is fine in Redis."""
    return (text or "").encode("utf-8", "backslashreplace").decode("utf-8")


class Jobs:
    """Redis commands of the broker: the script's calls and the reads beside them, under one namespace.

    ``declared()`` gives the queues declared in this process (Dramatiq's
    ``broker.queues``): on a cluster, with the queues anyone enqueued to,
    they are the scopes a job id or a dedup key is looked up in.
    """

    def __init__(
        self,
        client: redis.Redis,
        namespace: str,
        worker_id: str,
        *,
        settings: Settings,
        heartbeat_timeout: float,
        retention: float,
        declared: Callable[[], Iterable[str]],
    ) -> None:
        self.client = client
        self.worker_id = worker_id
        self._declared = declared
        #: On Redis Cluster every key of a queue carries the queue as its hash tag (see keys.py).
        self.cluster = is_cluster(client)
        self.keys = Keys(namespace, cluster=self.cluster)
        self.script = client.register_script(SCRIPT)
        self.retention_ms = int(retention * _MS)
        self.heartbeat_timeout_ms = int(heartbeat_timeout * _MS)
        #: A pause between recovery passes (anyone's) longer than this means Redis or every worker was away:
        #: recovery waits a heartbeat timeout before declaring anyone dead (see maintain in jobs.lua).
        self.recovery_gap_ms = int(max(heartbeat_timeout / 2, 3 * settings.maintenance_interval) * _MS)
        #: (replicas, timeout ms) each enqueue and claim WAITs for; None: no WAIT (redis_wait_replicas = 0).
        self.replicas = (
            (settings.redis_wait_replicas, int(settings.redis_wait_timeout * _MS))
            if settings.redis_wait_replicas
            else None
        )
        #: Script calls an enqueue may make: a lost reply's call is repeated (exactly: see send_enqueue).
        self.enqueue_attempts = 1 + settings.redis_retries
        #: ms jobs.lua keeps a duplicate's answer, so a repeated call answers the same: twice the longest a
        #: repeat can come after the first call (each attempt's connect, reply and WAIT timeouts and backoff
        #: capped at 2 s), at least a minute.
        attempt = settings.redis_connect_timeout + settings.redis_socket_timeout + settings.redis_wait_timeout + 2.0
        self.answer_ttl_ms = int(max(60.0, 2 * self.enqueue_attempts * attempt) * _MS)
        self._registered: set[str] = set()  # queues this process recorded in keys.queues (cluster)
        self._lock = threading.Lock()
        #: monotonic time a script call that heartbeats (see HEARTBEATS) was sent, of the last that succeeded.
        self._beat_at: float | None = None

    # -- plumbing -----------------------------------------------------------

    def call(self, command: str, queue: str, *args: Any, client: Any = None) -> Any:
        """One jobs.lua command in ``queue``'s scope ("": the namespace's, on a plain Redis), as this worker."""
        sent = time.monotonic()
        scope = self.keys.scope(queue).ns
        result = self.script(keys=[scope], args=[command, queue, self.worker_id, *args], client=client)
        if command in HEARTBEATS and client is None:
            with self._lock:  # the server wrote the heartbeat after `sent`
                self._beat_at = sent if self._beat_at is None else max(self._beat_at, sent)
        return result

    def heartbeat_age(self) -> float | None:
        beat = self._beat_at
        return None if beat is None else time.monotonic() - beat

    def close(self) -> None:
        """Drop the connections; the client stays usable (a later call reconnects)."""
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

    def leave(self, consumed: Iterable[str]) -> None:
        """Forget this worker's heartbeat (on a cluster: in each consumed queue's scope, one call each)."""
        if not self.cluster:
            self.call("leave", "")
            return
        for queue in sorted({q_name(name) for name in consumed}):
            self.call("leave", queue)

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
        names = set(self._declared())
        if self.cluster:
            names |= {text(q) for q in self.client.smembers(self.keys.queues)}
        return sorted(q_name(q) for q in names)

    def read_config(self) -> dict[str, str] | None:
        """The server's persistence and eviction settings (CONFIG GET); None when CONFIG is renamed or
        forbidden (managed Redis). Redis away: BrokerUnreachable."""
        try:
            config: dict[str, str] = {}
            for name in ("appendonly", "save", "maxmemory-policy"):
                config.update({text(k): text(v) for k, v in self.client.config_get(name).items()})
        except redis.ResponseError:
            return None
        except redis.RedisError as exc:
            raise BrokerUnreachable(f"Redis is unavailable: {type(exc).__name__}: {exc}") from exc
        return config

    # -- the consumer's calls ------------------------------------------------

    def wait(self, name: str, timeout: float) -> None:
        """Block until an enqueue to list ``name`` pushes its wake-up, or ``timeout`` seconds pass."""
        self.client.blpop([self.keys.scope(name).wake(name)], timeout=timeout)

    def fetch(
        self, name: str, room: int, aging_ms: int, cap: int, weights: dict[str, int] | None = None
    ) -> list[Fetched]:
        """Claim up to ``room`` messages of list ``name`` (``cap``: held jobs of one named group, 0: none;
        ``weights``: the queue's settings' group weights, which win over those stored, ``set_group_weight``)."""
        extra = [cap, *configured_weight_args(weights)]
        rows = (
            self.call("fetch", name, room, aging_ms, *extra)
            if self.replicas is None
            else self._fetch_replicated(name, room, aging_ms, extra)
        )
        out: list[Fetched] = []
        for i in range(0, len(rows), 5):
            wait = rows[i + 4]
            out.append(
                (
                    rows[i].decode(),
                    rows[i + 1],
                    int(rows[i + 2]),
                    rows[i + 3].decode(),
                    int(wait) if wait not in (b"", "", None) else None,
                )
            )
        return out

    def _fetch_replicated(self, name: str, room: int, aging_ms: int, extra: list[Any]) -> Any:
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
            self.script(
                keys=[scope],
                args=["fetch", name, self.worker_id, room, aging_ms, *extra],
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

    def acks(self, name: str, items: list[str | int]) -> list[Any]:
        """Acks of list ``name`` ((rid, job id, delivery) flat) in one call; the job ids whose ack was refused."""
        return list(self.call("acks", name, self.retention_ms, len(items) // 3, *items))

    def retry(self, name: str, rid: str, job_id: str, delivery: int, retry: Retry) -> int:
        """A failed delivery's outcome and its next run, fenced; -1: refused (superseded)."""
        done: int = self.call(
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
        return done

    def hand_back_unknown(
        self, name: str, rid: str, job_id: str, delivery: int, data: bytes, delay: float, error: str
    ) -> int:
        """A job of a type this process does not know to the delay queue for ``delay`` s, unattempted (``retry``)."""
        done: int = self.call(
            "retry", name, rid, job_id, delivery, str(uuid.uuid4()), data, int(delay * _MS), storable(error)
        )
        return done

    def nack(self, name: str, rid: str, job_id: str, delivery: int, error: str) -> int:
        """A delivery failed for good: fenced, it fails the job; -1: refused."""
        done: int = self.call("nack", name, rid, job_id, delivery, self.retention_ms, storable(error))
        return done

    def requeue(self, name: str, pairs: list[tuple[str, int]]) -> None:
        """(rid, delivery) pairs go back to their queue as new deliveries, unattempted."""
        self.call("requeue", name, *(x for pair in pairs for x in pair))

    def poison(self, name: str, rid: str, delivery: int, error: str) -> tuple[bool, str, str]:
        """An undecodable message to the dead letters: (its job's failure claimed, job id or "", job name)."""
        claimed, job_id, job = self.call("poison", name, rid, delivery, self.retention_ms, storable(error))
        return int(claimed) == 1, text(job_id) if job_id else "", text(job) if job_id else ""

    # -- enqueue -------------------------------------------------------------

    def register_queue(self, queue: str) -> None:
        """Cluster: record ``queue`` in keys.queues once per process, so lookups by job id read its scope."""
        if queue not in self._registered:
            with contextlib.suppress(redis.RedisError):  # lookups by job id read it; the enqueue may go on
                self.client.sadd(self.keys.queues, queue)
                self._registered.add(queue)

    def enqueue(self, rows: list[NewJob], *, dedup_ttl: float, aging_ms: int, queue: str | None) -> list[JobRef]:
        """The rows in one script call, all or none, in ``queue``'s scope (None: the namespace, plain Redis)."""
        scope = self.keys.ns if queue is None else self.keys.scope(queue).ns
        args: list[Any] = ["enqueue", "", self.worker_id, int(dedup_ttl * _MS), len(rows)]
        for row in rows:
            args += [*row]
        args += [self.answer_ttl_ms, aging_ms]  # aging: a named group's rank (jobs.lua)
        results = self.send_enqueue(args, len(rows), scope)
        return [JobRef(text(results[2 * i]), bool(int(results[2 * i + 1]))) for i in range(len(rows))]

    def send_enqueue(self, args: list[Any], count: int, scope: str) -> Any:
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
                return call_once(self._node_of(scope), self.script, [scope], args, replicas=self.replicas)
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

    def promote(self, origin: str, rid: str, job_id: str, delivery: int, data: bytes) -> int:
        """A held delayed message moves to its queue as ``data`` (``promote``): 1 moved, 0 nothing, -1 refused."""
        done: int = self.call("promote", origin, rid, job_id, delivery, data)
        return done

    # -- worker side ---------------------------------------------------------

    def start(self, queue: str, rid: str, job_id: str, delivery: int, acks: list[str | int]) -> tuple[int, list[Any]]:
        """The delivery's start, carrying buffered acks: (its attempt, or -1 refused, or CANCELLED_AT_START;
        the job ids of the acks refused)."""
        result = self.call("start", queue, rid, job_id, delivery, self.retention_ms, len(acks) // 3, *acks)
        return int(result[0]), list(result[1:])

    def claim_final(self, queue: str, rid: str, job_id: str, delivery: int, error: str) -> int:
        """1: this delivery claimed the job's final failure; 0: it was claimed already; -1: refused."""
        return int(self.call("claim_final", queue, rid, job_id, delivery, storable(error)))

    def is_current(self, queue: str, job_id: str, rid: str, delivery: int) -> bool:
        """One HMGET of the job's record: does it still point at this message and this delivery (jobs.lua's fence)?"""
        job_key = self.keys.scope(queue).job(job_id)
        current_rid, current = self.client.hmget(job_key, ["rid", "delivery"])
        return current_rid is not None and text(current_rid) == rid and current is not None and int(current) == delivery

    def maintain(self, queues: list[str], dead_message_ttl: int) -> dict[str, list[str]]:
        """Recover dead workers' jobs (server clock) of ``queues``, prune; {queue: job ids recovered}."""
        # On a cluster each queue's scope has its own heartbeats, acks sets and markers: one pass per queue.
        groups = [sorted(queues)] if not self.cluster else [[q] for q in sorted(queues)]
        recovered: dict[str, list[str]] = {}
        for group in groups:
            names = group + [dq_name(q) for q in group]
            rows = self.call(
                "maintain",
                group[0] if self.cluster else "",
                self.heartbeat_timeout_ms,
                self.retention_ms,
                dead_message_ttl,
                self.recovery_gap_ms,
                *names,
            )
            for i in range(0, len(rows), 2):
                recovered.setdefault(rows[i].decode(), []).append(rows[i + 1].decode())
        return recovered

    def release(self, name: str, held: list[str]) -> list[str]:
        """This worker's rids of list ``name`` not in ``held`` go back to it; the job ids handed back."""
        return [i.decode() for i in self.call("release", name, *held) or []]

    # -- reading -------------------------------------------------------------

    def counts(self, queue: str) -> QueueCounts:
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

    def group_counts(self, queue: str, limit: int) -> QueueGroups:
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

    def get(self, job_id: str) -> JobRecord | None:
        found = self.find(job_id)
        return None if found is None else record_from_hash(job_id, found[1])

    def find(self, job_id: str) -> tuple[Keys, dict[Any, Any]] | None:
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

    def list_jobs(self, queue: str, state: str, limit: int, offset: int) -> list[JobRecord]:
        keys = self.keys.scope(queue)
        ids = self.client.zrevrange(keys.index(queue, state), offset, offset + limit - 1)
        with self.client.pipeline(transaction=False) as pipe:
            for job_id in ids:
                pipe.hgetall(keys.job(text(job_id)))
            rows = pipe.execute()
        return [r for r in (record_from_hash(text(i), row) for i, row in zip(ids, rows)) if r]

    def pause(self, queue: str) -> None:
        self.client.sadd(self.keys.scope(queue).paused, queue)

    def resume(self, queue: str) -> None:
        self.client.srem(self.keys.scope(queue).paused, queue)

    # -- operator actions ----------------------------------------------------

    # -- group weights (weighted fair shares: jobs.lua's fetch reads gweights) ------------------

    def set_group_weight(self, queue: str, group: str, weight: int) -> None:
        """Store a named group's weight in the queue's scope (gweights); 1, every group's default, is absent."""
        key = self.keys.scope(queue).group_weights(queue)
        if weight == 1:
            self.client.hdel(key, group)
        else:
            self.client.hset(key, group, weight)

    def group_weights(self, queue: str) -> dict[str, int]:
        """The weights stored for the queue's named groups (those other than 1)."""
        found = self.client.hgetall(self.keys.scope(queue).group_weights(queue))
        return {text(g): int(w) for g, w in sorted(found.items()) if int(w) != 1}

    def job_queue(self, job_id: str) -> str | None:
        found = self.find(job_id)
        queue = None if found is None else found[1].get(b"queue")
        return text(queue) if queue else None

    def retry_job(self, job_id: str) -> bool:
        queue = self.job_queue(job_id)
        # The script re-checks state and queue: the record may change between the two calls.
        return queue is not None and bool(self.call("retry_job", queue, job_id))

    def retry_failed(self, queue: str) -> int:
        total = 0
        while True:
            retried, looked_at = self.call("retry_failed", queue, RETRY_BATCH)
            total += int(retried)
            if int(looked_at) < RETRY_BATCH:
                return total

    def delayed(self, job_id: str) -> tuple[str, str, bytes] | None:
        """A delayed (or awaiting) job's (queue, rid, stored message) in its delay queue, else None."""
        found = self.find(job_id)
        if found is None:
            return None
        keys, row = found
        stored_queue, stored_rid, state = row.get(b"queue"), row.get(b"rid"), row.get(b"state")
        if stored_queue is None or stored_rid is None or state not in (b"delayed", b"awaiting"):
            return None
        queue, rid = text(stored_queue), text(stored_rid)
        data = self.client.hget(keys.scope(queue).messages(dq_name(queue)), rid)
        if data is None:
            return None
        return queue, rid, data if isinstance(data, bytes) else data.encode()

    def promote_job(self, queue: str, job_id: str, rid: str, moved: bytes) -> bool:
        """One script call (``promote_job`` in jobs.lua), which re-checks that the job is still delayed with ``rid``."""
        return bool(self.call("promote_job", queue, job_id, rid, moved))

    def signal(self, name: str, resolution: str, ttl: float) -> int:
        """One script call (``signal`` in jobs.lua): the awaiting jobs move, the signal is kept. On a cluster
        each queue's scope keeps its own waiters and kept signals: one call per known queue."""
        ttl_ms = max(1, int(ttl * _MS))
        if not self.cluster:
            return int(self.call("signal", "", name, resolution, ttl_ms))
        return sum(int(self.call("signal", q, name, resolution, ttl_ms)) for q in self.known_queues())

    def resolve_wait(self, job_id: str, name: str, *, timed_out: bool) -> str | None:
        """One script call (``resolve_wait`` in jobs.lua): read, or record insert-first."""
        queue = self.job_queue(job_id) if self.cluster else ""
        found = self.call("resolve_wait", queue or "", job_id, name, "1" if timed_out else "0")
        return None if found is None else text(found)

    def delete(self, job_id: str) -> bool:
        queue = self.job_queue(job_id)
        return queue is not None and bool(self.call("delete", queue, job_id, self.retention_ms))

    # -- cancel ------------------------------------------------------------------

    def cancel(self, job_id: str) -> str | None:
        queue = self.job_queue(job_id)
        if queue is None:
            return None
        # The script re-checks the queue: "" when the record changed or went in between. The call's own id:
        # redis-py repeats a call whose reply was lost, and the repeat must answer what the first one did
        # (not "finished" for the job that first call cancelled).
        call = str(uuid.uuid4())
        outcome = text(
            self.call("cancel", queue, job_id, self.retention_ms, self.keys.cancels, call, self.answer_ttl_ms)
        )
        return outcome or None

    def cancelled(self, queue: str, rid: str, job_id: str, delivery: int, error: str | None) -> bool:
        """The delivery ends its job cancelled, fenced; False: refused (superseded)."""
        fence = self.call("cancelled", queue, rid, job_id, delivery, self.retention_ms, storable(error))
        return int(fence) == 1

    def cancel_requested(self, job_ids: list[str]) -> set[str]:
        if not job_ids:
            return set()
        if not self.cluster:
            return {text(i) for i in self.call("cancel_requested", "", *job_ids)}
        asked: set[str] = set()
        for job_id in job_ids:  # each record is in its own queue's scope
            queue = self.job_queue(job_id)
            if queue is not None:
                asked |= {text(i) for i in self.call("cancel_requested", queue, job_id)}
        return asked

    def cancel_listener(self) -> RedisCancels:
        return RedisCancels(self.client, self.keys.cancels)

    # -- Dramatiq's admin helpers (tests) ---------------------------------------

    def flush(self, queue_name: str) -> None:
        """What Dramatiq's purge does not know: on a cluster the queue's lists (its purge builds its keys from
        the bare namespace), and everywhere the priority levels and the groups' keys."""
        keys = self.keys.scope(queue_name)
        queue = q_name(queue_name)
        if self.cluster:
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

    def stored(self, queue_name: str) -> int:
        """Messages stored for the queue and its delay queue (Dramatiq's join, on a cluster)."""
        keys = self.keys.scope(queue_name)
        return sum(self.client.hlen(keys.messages(n)) for n in (q_name(queue_name), dq_name(queue_name)))


#: Error replies of a script refused at its first write, before it changed anything (redis-py names them
#: by class: OOM, READONLY; a LOADING reply is a BusyLoadingError, which is_unavailable counts already).
_REFUSED_BEFORE_WRITING = (redis.exceptions.OutOfMemoryError, redis.exceptions.ReadOnlyError)


def configured_weight_args(weights: dict[str, int] | None) -> list[Any]:
    """A queue's settings' group weights as fetch's trailing ARGV: group, weight, group, weight, ..."""
    return [x for group, weight in sorted((weights or {}).items()) for x in (group, weight)]


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


class RedisCancels:
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
