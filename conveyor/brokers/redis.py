"""The production broker: Dramatiq's RedisBroker, with conveyor's job records.

It keeps Dramatiq's key layout and consumer, and replaces its Lua with
``redis/jobs.lua`` so that a keyed enqueue, a start, an ack and a
recovery each change queue and job record in one atomic step.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import redis
from dramatiq import Message
from dramatiq.brokers.redis import RedisBroker as DramatiqRedisBroker
from dramatiq.brokers.redis import _RedisConsumer
from dramatiq.common import compute_backoff, current_millis, dq_name, q_name
from dramatiq.errors import ConnectionClosed, DecodeError

from ..errors import BrokerUnavailable
from ..logs import log_event
from .base import (
    JOB_STATES,
    ConveyorBroker,
    EnqueueItem,
    JobRecord,
    JobRef,
    QueueCounts,
    SafeMessageProxy,
    now_ms,
)

_SCRIPT = (Path(__file__).parent / "redis" / "jobs.lua").read_text()

_MS = 1000  # settings are in seconds, Dramatiq's Redis broker counts milliseconds

#: Failed jobs moved per script call by retry_failed: each call blocks Redis
#: while it runs, so a queue with many failures is retried in slices.
RETRY_BATCH = 500


#: A finished job's ack waits at most this long (s) for the worker's next start to carry it…
ACK_FLUSH_SECONDS = 0.05
#: …and at most this many acks wait at once.
ACK_BATCH = 64


class _AckBuffer:
    """Acks of finished jobs, sent along with the worker's next ``start`` call.

    A busy worker acks a job and starts the next one: carrying the acks in the
    start's script call halves its Redis calls per job. A flusher thread sends
    whatever no start picked up within ``ACK_FLUSH_SECONDS``. If the process
    dies first, those jobs run again after the heartbeat timeout, exactly as
    a job whose worker died mid-run does: processors are idempotent already.
    """

    def __init__(self, broker: "RedisBroker") -> None:
        self.broker = broker
        self._lock = threading.Lock()
        self._pending: dict[str, list] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def add(self, queue: str, rid: str, job_id: str) -> None:
        with self._lock:
            pending = self._pending.setdefault(queue, [])
            pending += (rid, job_id)
            full = len(pending) >= 2 * ACK_BATCH
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="conveyor-acks", daemon=True)
                self._thread.start()
        if full:
            self.flush(queue)

    def take(self, queue: str) -> list:
        with self._lock:
            return self._pending.pop(queue, [])

    def restore(self, queue: str, items: list) -> None:
        """Put back acks whose call failed, so the next one carries them."""
        if items:
            with self._lock:
                self._pending[queue] = items + self._pending.get(queue, [])

    def flush(self, queue: str | None = None) -> None:
        with self._lock:
            queues = [queue] if queue else list(self._pending)
        for name in queues:
            items = self.take(name)
            if not items:
                continue
            try:
                self.broker._call("acks", name, self.broker.retention_ms, len(items) // 2, *items)
            except redis.RedisError:
                self.restore(name, items)
                raise

    def _run(self) -> None:
        while not self._stop.wait(ACK_FLUSH_SECONDS):
            try:
                self.flush()
            except redis.RedisError as exc:  # Redis away for a moment: the acks wait for it
                log_event("error", level="warning", queue=None, job=None, job_id=None, attempt=None,
                          error=f"acks not sent yet: {type(exc).__name__}: {exc}")

    def close(self) -> None:
        self._stop.set()
        try:
            self.flush()
        except redis.RedisError:
            pass  # unacked jobs come back after the heartbeat timeout and run again


class RedisBroker(ConveyorBroker, DramatiqRedisBroker):
    """Dramatiq's RedisBroker plus keyed enqueue, attempts and job records."""

    def __init__(self, *, url: str, middleware: list, namespace: str, heartbeat_timeout: float, retention: float) -> None:
        super().__init__(
            url=url,
            middleware=middleware,
            namespace=namespace,
            # conveyor drives recovery itself (see maintain); never at random.
            maintenance_chance=0,
            heartbeat_timeout=int(heartbeat_timeout * _MS),
            dead_message_ttl=int(retention * _MS),
            socket_connect_timeout=5,
            socket_timeout=30,
            health_check_interval=30,
        )
        self.retention_ms = int(retention * _MS)
        self._jobs = self.client.register_script(_SCRIPT)
        self.acks = _AckBuffer(self)

    # -- plumbing -----------------------------------------------------------

    def close(self) -> None:
        """Send buffered acks, then close the connection pool (Dramatiq's leaves it to the garbage collector)."""
        self.acks.close()
        self.client.close()
        self.client.connection_pool.disconnect()

    def _call(self, command: str, queue: str, *args: Any, client: Any = None) -> Any:
        argv = [command, now_ms(), queue, self.broker_id, *args]
        return self._jobs(keys=[self.namespace], args=argv, client=client)

    @property
    def consumer_class(self):
        return _Consumer

    # -- enqueue -------------------------------------------------------------

    def enqueue(self, message: Message, *, delay: int | None = None) -> Message:
        """Dramatiq's enqueue (used for retries and delayed hops): never deduplicated."""
        return self._enqueue_many([EnqueueItem(message, None, delay)], dedup_ttl=1)[0][0]

    def enqueue_jobs(self, items: list[EnqueueItem], *, dedup_ttl: float) -> list[JobRef]:
        return [ref for _, ref in self._enqueue_many(items, dedup_ttl=dedup_ttl)]

    def _enqueue_many(self, items: list[EnqueueItem], *, dedup_ttl: float) -> list[tuple[Message, JobRef]]:
        prepared = []
        for item in items:
            message = item.message.copy(options={"redis_message_id": str(uuid.uuid4())})
            queue_name = message.queue_name
            if item.delay_ms is not None:
                queue_name = dq_name(queue_name)
                message = message.copy(queue_name=queue_name, options={"eta": current_millis() + item.delay_ms})
            self.emit_before("enqueue", message, item.delay_ms)
            prepared.append((message, item))
        try:
            with self.client.pipeline(transaction=False) as pipe:
                for message, item in prepared:
                    self._call(
                        "enqueue",
                        message.queue_name,
                        message.options["redis_message_id"],
                        message.message_id,
                        message.encode(),
                        message.actor_name,
                        item.key or "",
                        int(dedup_ttl * _MS),
                        message.options.get("eta", ""),
                        message.options.get("last_error", ""),
                        client=pipe,
                    )
                results = pipe.execute()
        except redis.RedisError as exc:
            raise BrokerUnavailable(f"Redis is unavailable, nothing was enqueued: {exc}") from exc
        out = []
        for (message, item), (job_id, duplicate) in zip(prepared, results):
            ref = JobRef(job_id.decode() if isinstance(job_id, bytes) else job_id, bool(duplicate))
            if not ref.deduplicated:
                self.emit_after("enqueue", message, item.delay_ms)
            out.append((message, ref))
        return out

    # -- worker side ---------------------------------------------------------

    def start_job(self, message: Any) -> int:
        queue = message.queue_name
        acks = self.acks.take(queue)
        try:
            return int(self._call("start", queue, message.options["redis_message_id"], message.message_id,
                                  self.retention_ms, len(acks) // 2, *acks))
        except redis.RedisError:
            self.acks.restore(queue, acks)
            raise

    def claim_final_failure(self, message: Any) -> bool:
        return bool(self.client.hsetnx(f"{self.namespace}:job:{message.message_id}", "final_failure", now_ms()))

    def maintain(self) -> dict[str, list[str]]:
        recovered = {}
        for queue in sorted(self.queues):
            for name in (queue, dq_name(queue)):
                ids = self._call("maintain", name, self.heartbeat_timeout, self.retention_ms, self.dead_message_ttl)
                if ids:
                    recovered.setdefault(queue, []).extend(i.decode() for i in ids)
        return recovered

    # -- reading -------------------------------------------------------------

    def queue_counts(self, queue: str) -> QueueCounts:
        ns = self.namespace
        with self.client.pipeline(transaction=False) as pipe:
            for state in ("waiting", "delayed", "active", "failed"):
                pipe.zcard(f"{ns}:idx:{queue}:{state}")
            pipe.hmget(f"{ns}:totals:{queue}", "completed", "failed")
            pipe.sismember(f"{ns}:paused", queue)
            # The waiting index is scored by when each job became waiting: the first is the oldest.
            pipe.zrange(f"{ns}:idx:{queue}:waiting", 0, 0, withscores=True)
            waiting, delayed, active, failed, (completed_total, failed_total), paused, oldest = pipe.execute()
        return QueueCounts(
            queue, waiting, delayed, active, failed, int(completed_total or 0), int(failed_total or 0), bool(paused),
            oldest[0][1] / _MS if oldest else None,
        )

    def get_job(self, job_id: str) -> JobRecord | None:
        return _record(job_id, self.client.hgetall(f"{self.namespace}:job:{job_id}"))

    def list_jobs(self, queue: str, state: str, *, limit: int = 50, offset: int = 0) -> list[JobRecord]:
        if state not in JOB_STATES:
            raise ValueError(f"unknown state {state!r}; states: {', '.join(JOB_STATES)}")
        ids = self.client.zrevrange(f"{self.namespace}:idx:{queue}:{state}", offset, offset + limit - 1)
        with self.client.pipeline(transaction=False) as pipe:
            for job_id in ids:
                pipe.hgetall(f"{self.namespace}:job:{job_id.decode()}")
            rows = pipe.execute()
        return [r for r in (_record(i.decode(), row) for i, row in zip(ids, rows)) if r]

    def pause_queue(self, queue: str) -> None:
        self.client.sadd(f"{self.namespace}:paused", queue)

    def resume_queue(self, queue: str) -> None:
        self.client.srem(f"{self.namespace}:paused", queue)

    # -- operator actions ----------------------------------------------------

    def _job_queue(self, job_id: str) -> str | None:
        queue = self.client.hget(f"{self.namespace}:job:{job_id}", "queue")
        return queue.decode() if queue else None

    def retry_job(self, job_id: str) -> bool:
        queue = self._job_queue(job_id)
        # The script re-checks state and queue: the record may change between the two calls.
        return bool(queue) and bool(self._call("retry", queue, job_id))

    def retry_failed(self, queue: str) -> int:
        total = 0
        while True:
            retried, looked_at = self._call("retry_failed", queue, RETRY_BATCH)
            total += int(retried)
            if int(looked_at) < RETRY_BATCH:
                return total

    def delete_job(self, job_id: str) -> bool:
        queue = self._job_queue(job_id)
        return bool(queue) and bool(self._call("delete", queue, job_id, self.retention_ms))


def _record(job_id: str, raw: dict) -> JobRecord | None:
    if not raw or b"state" not in raw:
        return None
    row = {k.decode(): v.decode() for k, v in raw.items()}
    try:
        message = json.loads(row.get("payload", "{}"))
        payload = (message.get("args") or [{}])[0]
    except (ValueError, AttributeError, IndexError):
        payload = {}

    def seconds(name: str) -> float | None:
        return int(row[name]) / _MS if row.get(name) else None

    return JobRecord(
        id=job_id,
        queue=row.get("queue", ""),
        job=row.get("job", ""),
        state=row["state"],
        attempts=int(row.get("attempts", 0)),
        key=row.get("key"),
        payload=payload if isinstance(payload, dict) else {},
        error=row.get("error"),
        enqueued_at=seconds("enqueued_at"),
        started_at=seconds("started_at"),
        finished_at=seconds("finished_at"),
        eta=seconds("eta"),
    )


class _Consumer(_RedisConsumer):
    """Dramatiq's consumer on conveyor's script; an undecodable message fails alone."""

    def __init__(self, broker, queue_name, prefetch, timeout) -> None:
        super().__init__(broker, queue_name, prefetch, timeout)
        self.wake_key = f"{broker.namespace}:wake:{queue_name}"

    def ack(self, message: SafeMessageProxy) -> None:
        if self.queue_name.endswith(".DQ"):
            self._post("ack", message, self.broker.retention_ms)
            return
        self.broker.acks.add(self.queue_name, message.options["redis_message_id"], message.message_id)
        self.queued_message_ids.discard(message.message_id)

    def nack(self, message: SafeMessageProxy) -> None:
        error = message.options.get("last_error") or "failed"
        self._post("nack", message, self.broker.retention_ms, error)

    def _post(self, command: str, message: SafeMessageProxy, *args: Any) -> None:
        try:
            self.broker._call(command, self.queue_name, message.options["redis_message_id"], message.message_id, *args)
        except redis.ConnectionError as exc:
            raise ConnectionClosed(exc) from None
        finally:
            self.queued_message_ids.discard(message.message_id)

    def requeue(self, messages) -> None:
        rids = [m.options["redis_message_id"] for m in messages]
        if rids:
            self.broker._call("requeue", self.queue_name, *rids)

    def __next__(self) -> SafeMessageProxy | None:
        try:
            while True:
                if self.message_cache:
                    rid, data = self.message_cache.pop(0), self.message_cache.pop(0)
                    try:
                        message = Message.decode(data)
                    except DecodeError as exc:
                        self._poison(rid, exc)
                        continue
                    self.misses = 0
                    self.queued_message_ids.add(message.message_id)
                    return SafeMessageProxy(message)

                fetched = []
                room = self.prefetch - self.outstanding_message_count
                if room > 0:
                    fetched = self.message_cache = self.broker._call("fetch", self.queue_name, room)
                if not fetched:
                    # Wait for an enqueue's wake-up, at most the (growing) idle backoff: a
                    # lost wake-up costs one backoff, never a job.
                    self.misses, backoff_ms = compute_backoff(self.misses, max_backoff=self.timeout)
                    if room > 0:
                        self.broker.client.blpop([self.wake_key], timeout=backoff_ms / 1000)
                    else:
                        time.sleep(backoff_ms / 1000)
                    return None
        except redis.ConnectionError as exc:
            raise ConnectionClosed(exc) from None

    @property
    def outstanding_message_count(self) -> int:
        return len(self.queued_message_ids) + len(self.message_cache) // 2

    def _poison(self, rid: bytes, exc: Exception) -> None:
        self.broker._call("poison", self.queue_name, rid)
        log_event(
            "error",
            level="error",
            queue=q_name(self.queue_name),
            job=None,
            job_id=None,
            attempt=None,
            error=f"malformed message {rid.decode(errors='replace')} moved to the dead letters: {exc}",
        )
