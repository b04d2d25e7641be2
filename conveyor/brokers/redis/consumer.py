"""The Redis consumer: fetch in batches, hand messages to Dramatiq, settle each delivery's outcome.

Every message carries the delivery it came with (``redis_delivery``, see
``jobs.lua``): its outcome is written only while that delivery is the
job's current one. An outcome that cannot be written (Redis away, a
timeout) raises :class:`dramatiq.errors.ConnectionClosed`, which Dramatiq's
``post_process_message`` retries until Redis answers: the job stays in
this worker's acks set meanwhile, and is recovered if the worker dies.

Like the Postgres consumer, it depends on the broker's public parts only:
``deliveries`` (what this process holds, see ``deliveries.py``), ``acks``,
the consumer's calls ``fetch``, ``send_acks``, ``write_retry``,
``write_nack`` and ``hand_back``, and ``hand_back_unknown``,
``fail_malformed``, ``wait_cap`` and ``actors``; an idle consumer waits on
``jobs.wait`` (``jobs.py``, where every Redis command of the broker is).
``tests/unit/test_broker_capabilities.py`` keeps it so.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from typing import TYPE_CHECKING, Callable, Iterable

import redis
from dramatiq import Consumer, Message
from dramatiq.broker import MessageProxy
from dramatiq.common import compute_backoff, current_millis, q_name
from dramatiq.errors import ConnectionClosed, DecodeError

from conveyor.brokers.base import FINALIZE, AnyMessage, SafeMessageProxy
from conveyor.brokers.redis.deliveries import refused
from conveyor.brokers.redis.replies import text
from conveyor.errors import BrokerRejected
from conveyor.logs import log_error, log_event
from conveyor.redis_client import is_unavailable

if TYPE_CHECKING:
    from conveyor.brokers.redis.broker import RedisBroker

#: Message options that belong to one delivery, never stored with the job.
DELIVERY_OPTIONS = ("redis_message_id", "redis_delivery", "redis_queue", "redis_release", "redis_unsettled", FINALIZE)

#: A finished job's ack waits at most this long (s) for the worker's next start to carry it…
ACK_FLUSH_SECONDS = 0.05
#: …and at most this many acks wait at once.
ACK_BATCH = 64

#: Acks as the script takes them: (rid, job id, delivery) after (rid, job id, delivery), flat.
AckItems = list[str | int]


def delivery_of(message: AnyMessage) -> tuple[str, int] | None:
    """(rid, delivery) of a message this broker handed out, else None."""
    options = message.options
    rid, delivery = options.get("redis_message_id"), options.get("redis_delivery")
    if rid is None or delivery is None:
        return None
    return rid, int(delivery)


class AckBuffer:
    """Acks of finished jobs, sent along with the worker's next ``start`` call.

    A busy worker acks a job and starts the next one: carrying the acks in the
    start's script call halves its Redis calls per job. A flusher thread sends
    whatever no start picked up within ``ACK_FLUSH_SECONDS``. An ack stays
    here until Redis took it (a failed call puts it back), and its job stays
    held by this worker until then; if the process dies first, the job is
    recovered as a new delivery after the heartbeat timeout.
    """

    def __init__(self, broker: "RedisBroker") -> None:
        self.broker = broker
        self._lock = threading.Lock()
        self._pending: dict[str, AckItems] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def add(self, queue: str, rid: str, job_id: str, delivery: int) -> None:
        with self._lock:
            pending = self._pending.setdefault(queue, [])
            pending += (rid, job_id, delivery)
            full = len(pending) >= 3 * ACK_BATCH
            if self._thread is None or not self._thread.is_alive():
                self._stop.clear()
                self._thread = threading.Thread(target=self._run, name="conveyor-acks", daemon=True)
                self._thread.start()
        if full:
            self.flush(queue)

    def waiting(self, queue: str) -> int:
        """How many acks of ``queue`` wait here (their jobs are done, though still held until sent)."""
        return len(self._pending.get(queue, ())) // 3

    def take(self, queue: str) -> AckItems:
        with self._lock:
            return self._pending.pop(queue, [])

    def restore(self, queue: str, items: AckItems) -> None:
        """Put back acks whose call failed, so the next one carries them."""
        if items:
            with self._lock:
                self._pending[queue] = items + self._pending.get(queue, [])

    def sent(self, queue: str, items: AckItems, refused_ids: Iterable[object]) -> None:
        """Acks Redis took: their jobs are no longer held; refused ones were superseded deliveries."""
        self.broker.deliveries.settle(
            queue, [(str(rid), int(delivery)) for rid, delivery in zip(items[0::3], items[2::3])]
        )
        for job_id in refused_ids:
            refused("ack", q_name(queue), text(job_id))

    def flush(self, queue: str | None = None) -> None:
        with self._lock:
            queues = [queue] if queue else list(self._pending)
        for name in queues:
            items = self.take(name)
            if not items:
                continue
            try:
                refused_ids = self.broker.send_acks(name, items)
            except Exception:
                self.restore(name, items)
                raise
            self.sent(name, items, refused_ids)

    def _run(self) -> None:
        # time.sleep, not Event.wait: a condition wait with a timeout misbehaves under a faked clock.
        while not self._stop.is_set():
            time.sleep(ACK_FLUSH_SECONDS)
            try:
                self.flush()
            except Exception as exc:  # Redis away for a moment: the acks wait for it
                log_error(f"acks not sent yet: {type(exc).__name__}: {exc}")
                time.sleep(1.0)

    def close(self) -> None:
        """Stop the flusher and send what is left; raises if Redis cannot take it."""
        self._stop.set()
        self.flush()


class RedisConsumer(Consumer):
    """Dramatiq consumer on conveyor's script, for one queue or one delay queue."""

    def __init__(self, broker: "RedisBroker", queue_name: str, prefetch: int, timeout: int) -> None:
        self.broker = broker
        self.queue_name = queue_name
        self.prefetch = max(1, prefetch)
        self.timeout = timeout
        self.is_delay = queue_name.endswith(".DQ")
        self.misses = 0
        #: Fetched and decoded, not handed to Dramatiq yet.
        self.cache: deque[SafeMessageProxy] = deque()
        #: Delay queue only: handed to the consumer thread's in-memory delay queue, not promoted yet.
        #: When this consumer is closed those are no longer in flight anywhere.
        self.handed: dict[str, int] = {}

    # -- receiving -------------------------------------------------------------

    def __next__(self) -> SafeMessageProxy | None:
        try:
            return self._next()
        except redis.RedisError as exc:
            if is_unavailable(exc):
                raise ConnectionClosed(exc) from None
            raise BrokerRejected(f"Redis refused a fetch: {type(exc).__name__}: {exc}") from exc

    def _next(self) -> SafeMessageProxy | None:
        while True:
            if self.cache:
                message = self.cache.popleft()
                if self.is_delay:
                    self.handed[message.options["redis_message_id"]] = message.options["redis_delivery"]
                self.misses = 0
                return message
            room = self.prefetch - self.outstanding_message_count
            if room > 0:
                rows = self.broker.fetch(self.queue_name, room)
                for i, (rid, data, delivery, note, wait) in enumerate(rows):
                    try:
                        self._receive(rid, data, delivery, note, wait)
                    except BaseException:
                        # Not cached, so not handed back by close(): unhold them for the release pass.
                        self.broker.deliveries.settle(self.queue_name, [(r[0], r[2]) for r in rows[i:]])
                        raise
                if self.cache:
                    continue
            # Idle, before waiting: acks no start will carry go now (not only from the flusher thread).
            if room > 0 and self.broker.acks.waiting(self.queue_name):
                self.broker.acks.flush(self.queue_name)
            # Wait for an enqueue's wake-up, at most the (growing) idle backoff: a
            # lost wake-up costs one backoff, never a job.
            self.misses, backoff_ms = compute_backoff(self.misses, max_backoff=self.timeout)
            if room > 0:
                self.broker.jobs.wait(self.queue_name, min(backoff_ms / 1000, self.broker.wait_cap))
            else:
                time.sleep(backoff_ms / 1000)
            return None

    def _receive(self, rid: str, data: bytes, delivery: int, note: str, wait: int | None) -> None:
        try:
            if delivery == 0:
                raise DecodeError("no message id", data, ValueError("the script could not read its message id"))
            message = Message.decode(data)
        except DecodeError as exc:
            self._poison(rid, delivery, exc)
            return
        if not self.is_delay and message.actor_name not in self.broker.actors:
            # A newer producer's job type (a rolling deploy): Dramatiq's worker would fail it for good.
            self.broker.hand_back_unknown(self.queue_name, rid, delivery, message, data)
            return
        options = {k: v for k, v in message.options.items() if k not in DELIVERY_OPTIONS}
        # The fetch is the truth about which message and which delivery this is.
        options.update(redis_message_id=rid, redis_delivery=delivery, redis_queue=self.queue_name)
        if wait is not None:
            # Due on the server's clock: Dramatiq compares the eta with this host's clock.
            options["eta"] = current_millis() + wait
        message = message.copy(queue_name=self.queue_name)
        message.options.clear()
        message.options.update(options)
        if note == "finalize":
            message.options[FINALIZE] = True
        if note == "adopted":
            log_event(
                "adopted",
                level="warning",
                queue=q_name(self.queue_name),
                job=message.actor_name,
                job_id=message.message_id,
                attempt=None,
                reason="message without a job record (an older producer): record created, job runs",
            )
        self.cache.append(SafeMessageProxy(message))

    def _poison(self, rid: str, delivery: int, exc: Exception) -> None:
        self.broker.fail_malformed(self.queue_name, rid, delivery, exc)

    @property
    def outstanding_message_count(self) -> int:
        """Messages of this queue fetched by this process and not done: the prefetch counts these
        (a replaced consumer's jobs still running too), not acks waiting to be sent."""
        return self.broker.deliveries.count(self.queue_name) - self.broker.acks.waiting(self.queue_name)

    # -- outcomes (called from worker threads) -----------------------------------

    def ack(self, message: MessageProxy) -> None:
        held = delivery_of(message)
        if held is None:
            return
        rid, delivery = held
        if self.is_delay:
            # Dramatiq acks a delayed message right after broker.enqueue promoted it (one script).
            self.handed.pop(rid, None)
            return
        options = message.options
        if options.get("redis_release") or options.get("redis_unsettled"):
            # Never started, or an outcome that could not be written (a cancelled run's: Dramatiq acks a run it
            # did not fail): it runs again as a new delivery, whose start ends it cancelled. Never completed.
            self._hand_back([message])
            return
        retry = self.broker.deliveries.take_retry(message.message_id, delivery)
        if retry is not None:
            self._guard(
                lambda: self.broker.write_retry(self.queue_name, rid, message.message_id, delivery, retry),
                message,
                restore=lambda: self.broker.deliveries.keep_retry(message.message_id, delivery, retry),
            )
            return
        self.broker.acks.add(self.queue_name, rid, message.message_id, delivery)

    def nack(self, message: MessageProxy) -> None:
        held = delivery_of(message)
        if held is None:
            return
        rid, delivery = held
        self.handed.pop(rid, None)
        if message.options.get("redis_release") or message.options.get("redis_unsettled"):
            # Its start or its final-failure claim was never written: it runs again as a new delivery.
            self._hand_back([message])
            return
        error = message.options.get("last_error") or "failed"
        self._guard(lambda: self.broker.write_nack(self.queue_name, rid, message.message_id, delivery, error), message)

    def requeue(self, messages: Iterable[MessageProxy]) -> None:
        self._hand_back(list(messages))

    def _hand_back(self, messages: list[MessageProxy]) -> None:
        """Raises only ConnectionClosed (Dramatiq retries or logs it); a refused hand-back unholds the
        messages for the release pass, since Dramatiq's callers (ConsumerThread.close) die on anything else."""
        pairs = [held for held in map(delivery_of, messages) if held is not None]
        for rid, _ in pairs:
            self.handed.pop(rid, None)
        try:
            self.broker.hand_back(self.queue_name, pairs)
        except Exception as exc:
            if is_unavailable(exc):
                raise ConnectionClosed(exc) from None
            self.broker.deliveries.settle(self.queue_name, pairs)
            log_error(
                f"{len(pairs)} job(s) not handed back, the release pass will: {type(exc).__name__}: {exc}",
                level="error",
                queue=q_name(self.queue_name),
            )

    def _guard(
        self, write: Callable[[], None], message: MessageProxy | None, restore: Callable[[], None] | None = None
    ) -> None:
        """Run an outcome's write. Redis away: keep the job held and raise ConnectionClosed (Dramatiq retries).
        Any other error: the job is no longer in flight here, so the next release pass hands it back."""
        try:
            write()
        except Exception as exc:
            if is_unavailable(exc):
                if restore:
                    restore()
                raise ConnectionClosed(exc) from None
            if message is not None and (held := delivery_of(message)):
                self.broker.deliveries.settle(self.queue_name, [held])
            log_event(
                "error",
                level="error",
                queue=q_name(self.queue_name),
                job=None,
                job_id=getattr(message, "message_id", None),
                attempt=None,
                error=f"outcome not written, the job will be handed back: {type(exc).__name__}: {exc}",
            )
            if isinstance(exc, redis.RedisError):
                raise BrokerRejected(f"Redis refused an outcome: {type(exc).__name__}: {exc}") from exc
            raise

    def close(self) -> None:
        """Hand back what this consumer fetched and no worker thread holds (see the class docstring)."""
        pending = list(self.cache)
        self.cache.clear()
        fetched = [delivery_of(m) for m in pending] + list(self.handed.items())
        self.handed.clear()
        pairs = [p for p in fetched if p is not None]
        if not pairs:
            return
        try:
            self.broker.hand_back(self.queue_name, pairs)
        except Exception as exc:
            # No longer in flight here either way: the next release pass (or recovery) hands them back.
            self.broker.deliveries.settle(self.queue_name, pairs)
            log_error(
                f"{len(pairs)} fetched job(s) not handed back yet: {type(exc).__name__}: {exc}",
                queue=q_name(self.queue_name),
            )
