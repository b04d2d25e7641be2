"""The Postgres broker's consumer: claim in batches, sleep until woken, write outcomes in batches.

One consumer per queue per worker process (Dramatiq's consumer thread).
Its loop:

1. write the outcomes the worker threads left in the :class:`Outbox`
   (acks, failures, hand-backs) in one statement;
2. when there is room in the prefetch and there may be work (woken by a
   notification, still draining, or the poll is due), *arm* the wake-up
   and claim up to the room in one statement;
3. otherwise sleep until a notification, an outcome to write, the poll
   (``CONVEYOR_PG_POLL_SECONDS``) or the next delayed job, whichever is first.

Arming before the claim means a notification that arrives between an
empty claim and the sleep is not lost: it finds the wake-up armed and the
sleep returns at once. After a wake-up the consumer keeps claiming while
claims come back full (it drains), and goes back to sleep on the first
claim that comes back short.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections import deque
from typing import TYPE_CHECKING, Any

from dramatiq import Consumer, Message
from dramatiq.common import q_name
from dramatiq.errors import ConnectionClosed, DecodeError

from .base import SafeMessageProxy

if TYPE_CHECKING:
    from .postgres import PostgresBroker

#: Seconds added to a delayed job's due time before claiming it (clock and rounding slack).
DUE_MARGIN = 0.005

#: Message options that belong to one delivery, never stored with the job.
DELIVERY_OPTIONS = ("pg_delivery", "pg_release", "eta")


@dataclasses.dataclass
class _Retry:
    message: str
    due: float  # time.time() at which it may run
    error: str | None


class Outbox:
    """Outcomes of deliveries not yet written, keyed by (job id, delivery).

    Worker threads put outcomes here (no round trip on their path); the
    consumer thread writes them all in one statement. When the write fails
    (Postgres is restarting) they stay here and are written on the next try.
    A retry written while Postgres was away is kept here too, and supersedes
    the ack Dramatiq sends for the same delivery right after it.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._write_lock = threading.Lock()
        self._outcomes: dict[tuple[str, int], tuple[str, str | None]] = {}
        self._retries: dict[tuple[str, int], _Retry] = {}

    def put(self, job_id: str, delivery: int, status: str, error: str | None = None) -> None:
        key = (job_id, delivery)
        with self._lock:
            if key in self._retries:
                return
            previous = self._outcomes.get(key)
            if previous and previous[0] == "pending":
                return  # handed back unstarted: the ack of the skipped run changes nothing
            self._outcomes[key] = (status, error)

    def put_retry(self, job_id: str, delivery: int, retry: _Retry) -> None:
        with self._lock:
            self._retries[(job_id, delivery)] = retry
            self._outcomes.pop((job_id, delivery), None)

    def job_ids(self) -> set[str]:
        with self._lock:
            return {k[0] for k in self._outcomes} | {k[0] for k in self._retries}

    def __bool__(self) -> bool:
        return bool(self._outcomes or self._retries)

    def write(self, broker: "PostgresBroker") -> None:
        """Write everything waiting; on a database error keep it and raise."""
        if not self:
            return
        with self._write_lock:  # one writer at a time keeps retries before acks
            with self._lock:
                retries, self._retries = self._retries, {}
                outcomes, self._outcomes = self._outcomes, {}
            try:
                while retries:
                    key, retry = next(iter(retries.items()))
                    broker._write_retry(key[0], key[1], retry.message, max(0.0, retry.due - time.time()),
                                        retry.error)
                    del retries[key]
                if outcomes:
                    broker._write_outcomes(outcomes)
            except BaseException:
                with self._lock:
                    for key, retry in retries.items():
                        self._retries.setdefault(key, retry)
                    for key, outcome in outcomes.items():
                        if key not in self._retries:
                            self._outcomes.setdefault(key, outcome)
                raise


class PostgresConsumer(Consumer):
    """Dramatiq consumer on the jobs table. See the module docstring for its loop."""

    def __init__(self, broker: "PostgresBroker", queue_name: str, prefetch: int, timeout: int) -> None:
        self.broker = broker
        self.queue_name = queue_name
        self.queue = q_name(queue_name)
        self.prefetch = max(1, prefetch)
        self.timeout = timeout / 1000
        self.ready: deque[SafeMessageProxy] = deque()
        #: Ids this consumer claimed and has not had an outcome for.
        self.held: set[str] = set()
        self.wake = broker._listener.subscribe(self.queue)
        self.draining = True  # claim at once on start: jobs may be waiting
        self.poll_at = 0.0
        #: After a short claim: look up the next delayed job before sleeping (not before handing out the claim).
        self.check_due = False

    def __next__(self) -> SafeMessageProxy | None:
        try:
            return self._next()
        except self.broker.db_errors as exc:
            self.broker._pool_trouble()
            raise ConnectionClosed(exc) from None

    def _next(self) -> SafeMessageProxy | None:
        deadline = time.monotonic() + self.timeout
        while True:
            if self.ready:
                return self.ready.popleft()
            self.wake.event.clear()
            # Outcomes left by the worker threads meanwhile, all in one statement.
            self.broker._outbox.write(self.broker)
            now = time.monotonic()
            room = self.prefetch - len(self.held)
            can_claim = room > 0 and self.broker._may_claim()
            if can_claim and (self.draining or self.wake.notified or now >= self.poll_at):
                self.wake.arm()
                claimed = self._claim(room)
                # A short claim means the queue is empty for now: sleep until a
                # notification, the poll, or the next delayed job turns due.
                self.draining = claimed == room
                self.check_due = not self.draining
                self.poll_at = now + self.broker.poll_seconds
                continue
            if self.check_due and can_claim:
                self.check_due = False
                due = self.broker._next_due(self.queue)
                if due is not None:
                    # The margin keeps a wake-up from landing a hair before the row turns due.
                    self.poll_at = min(self.poll_at, time.monotonic() + max(due, 0.0) + DUE_MARGIN)
                continue
            # Full, or not allowed to claim (no heartbeat): only an outcome or the deadline can change that.
            until = min(deadline, self.poll_at) if can_claim else deadline
            if until > now:
                self.wake.event.wait(until - now)
            if time.monotonic() >= deadline:
                self.broker._outbox.write(self.broker)
                return None

    def _claim(self, room: int) -> int:
        rows = self.broker._claim_rows(self.queue, room)
        for job_id, queue, job, delivery, text in rows:
            self.broker._hold(job_id, delivery)
            try:
                message = Message.decode(text.encode())
            except DecodeError as exc:
                self.broker._fail_malformed(job_id, queue, job, delivery, exc)
                continue
            # The row is the truth about identity and queue; the delivery
            # number goes with the message so its outcome finds this claim.
            options = {k: v for k, v in message.options.items() if k not in DELIVERY_OPTIONS}
            options["pg_delivery"] = delivery
            message = dataclasses.replace(message, message_id=job_id, queue_name=self.queue_name, options=options)
            self.held.add(job_id)
            self.ready.append(SafeMessageProxy(message))
        return len(rows)

    # -- outcomes (called from worker threads) ---------------------------------

    def ack(self, message: Any) -> None:
        self._settle(message, "done", None)

    def nack(self, message: Any) -> None:
        self._settle(message, "failed", message.options.get("last_error") or "failed")

    def requeue(self, messages) -> None:
        for message in messages:
            self._settle(message, "pending", None)

    def _settle(self, message: Any, status: str, error: str | None) -> None:
        delivery = message.options.get("pg_delivery")
        if delivery is not None:
            if message.options.get("pg_release"):
                status = "pending"  # never started: hand it back
            self.broker._settle(message.message_id, delivery, status, error)
        self.held.discard(message.message_id)
        self.wake.poke()

    def close(self) -> None:
        self.broker._listener.unsubscribe(self.queue, self.wake)
        # Claimed but never handed to a worker thread: back to the queue.
        for proxy in list(self.ready):
            self._settle(proxy, "pending", None)
        self.ready.clear()
        try:
            self.broker._outbox.write(self.broker)
        except self.broker.db_errors:
            pass  # kept in the outbox: the next consumer or the broker's close writes it
