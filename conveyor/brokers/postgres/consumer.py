"""The Postgres broker's consumer: claim in batches, sleep until woken, write outcomes in batches.

One consumer per queue per worker process (Dramatiq's consumer thread).
Its loop:

1. write the outcomes the worker threads left in the outbox
   (:class:`~.deliveries.Deliveries`: acks, failures, hand-backs) in one statement;
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

It depends on the broker's public parts only: ``jobs`` (the data access),
``deliveries`` (holds and the outbox), ``listener`` (wake-ups),
``may_claim()`` and ``fail_malformed()``.
"""

from __future__ import annotations

import dataclasses
import time
from collections import deque
from typing import TYPE_CHECKING, Any, Iterable

from dramatiq import Consumer, Message
from dramatiq.broker import MessageProxy
from dramatiq.common import q_name
from dramatiq.errors import ConnectionClosed, DecodeError

from conveyor.brokers.base import FINALIZE, SafeMessageProxy
from conveyor.brokers.postgres.durability import PROVEN
from conveyor.errors import ConveyorError
from conveyor.logs import log_error

if TYPE_CHECKING:
    from conveyor.brokers.postgres.broker import PostgresBroker

#: Seconds added to a delayed job's due time before claiming it (clock and rounding slack).
DUE_MARGIN = 0.005
#: Seconds before a grouped queue whose short claim left runnable rows is claimed again. Those rows
#: wait for their group's slot (a cap) or are another claimer's: re-claiming every DUE_MARGIN would
#: spin. A slot frees when a job of the group ends, and the worker that ends it claims at once itself.
GROUPED_RECHECK = 0.25

#: A busy consumer claims once its room is at least this part of the prefetch: each
#: claim costs one WAL flush (durability.py), so claims come in batches, not one by one.
#: An idle consumer claims at once, whatever the room.
CLAIM_BATCH_PART = 4

#: Message options that belong to one delivery, never stored with the job.
DELIVERY_OPTIONS = ("pg_delivery", "pg_release", "pg_proof", "eta", FINALIZE)


class PostgresConsumer(Consumer):
    """Dramatiq consumer on the jobs table. See the module docstring for its loop."""

    def __init__(self, broker: "PostgresBroker", queue_name: str, prefetch: int, timeout: int) -> None:
        self.broker = broker
        self.queue_name = queue_name
        self.queue = q_name(queue_name)
        self.prefetch = max(1, prefetch)
        self.timeout = timeout / 1000
        self.ready: deque[SafeMessageProxy] = deque()
        #: id -> delivery this consumer claimed and has not had an outcome for (its prefetch room).
        self.held: dict[str, int] = {}
        self.wake = broker.listener.subscribe(self.queue)
        self.draining = True  # claim at once on start: jobs may be waiting
        self.poll_at = 0.0
        #: After a short claim: look up the next delayed job before sleeping (not before handing out the claim).
        self.check_due = False

    def __next__(self) -> SafeMessageProxy | None:
        # Any error ends this consumer and Dramatiq starts a new one after a
        # pause (its ConnectionError path); nothing held here is lost: what
        # was never handed out goes back in close(), the outbox stays.
        try:
            return self._next()
        except ConveyorError as exc:
            log_error(f"postgres consumer restarts: {exc}", queue=self.queue)
            raise ConnectionClosed(exc) from None

    def _next(self) -> SafeMessageProxy | None:
        deadline = time.monotonic() + self.timeout
        while True:
            if self.ready:
                return self.ready.popleft()
            self.wake.event.clear()
            # Outcomes left by the worker threads meanwhile, all in one statement.
            self.broker.deliveries.write()
            now = time.monotonic()
            room = self.prefetch - len(self.held)
            batch = 1 if not self.held else max(1, self.prefetch // CLAIM_BATCH_PART)
            can_claim = room >= batch and self.broker.may_claim()
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
                due = self.broker.jobs.next_due(self.queue)
                if due is not None:
                    if due <= 0 and self.broker.jobs.is_grouped(self.queue):
                        due = GROUPED_RECHECK  # runnable but capped or held: no spin (see GROUPED_RECHECK)
                    # The margin keeps a wake-up from landing a hair before the row turns due.
                    self.poll_at = min(self.poll_at, time.monotonic() + max(due, 0.0) + DUE_MARGIN)
                continue
            # Full, or not allowed to claim (no heartbeat): only an outcome or the deadline can change that.
            until = min(deadline, self.poll_at) if can_claim else deadline
            if until > now:
                self.wake.event.wait(until - now)
            if time.monotonic() >= deadline:
                self.broker.deliveries.write()
                return None

    def _claim(self, room: int) -> int:
        proofs = self.broker.proofs
        epoch = proofs.epoch_before_claim()
        rows = self.broker.jobs.claim(
            self.queue,
            room,
            synchronous=epoch == 0,
            group_cap=self.broker.group_caps.get(self.queue),
            group_weights=self.broker.group_weights.get(self.queue),
        )
        ticket = proofs.request(epoch) if rows and epoch else PROVEN
        for job_id, queue, job, delivery, text, finalize in rows:
            self.broker.deliveries.hold(job_id, delivery)
            try:
                message = Message.decode(text.encode())
            except DecodeError as exc:
                self.broker.fail_malformed(job_id, queue, job, delivery, exc)
                continue
            if message.actor_name not in self.broker.actors:
                # A newer producer's job type (a rolling deploy): Dramatiq's worker would fail it for good.
                self.broker.hand_back_unknown(job_id, delivery, dataclasses.replace(message, message_id=job_id), text)
                continue
            # The row is the truth about identity and queue; the delivery
            # number goes with the message so its outcome finds this claim.
            options = {k: v for k, v in message.options.items() if k not in DELIVERY_OPTIONS}
            options["pg_delivery"] = delivery
            options["pg_proof"] = ticket  # its job starts once the claim is on disk
            if finalize:
                options[FINALIZE] = True
            message = dataclasses.replace(message, message_id=job_id, queue_name=self.queue_name, options=options)
            self.held[job_id] = delivery
            self.ready.append(SafeMessageProxy(message))
        return len(rows)

    # -- outcomes (called from worker threads) ---------------------------------

    def ack(self, message: Any) -> None:
        self._settle(message, "done", None)

    def nack(self, message: Any) -> None:
        self._settle(message, "failed", message.options.get("last_error") or "failed")

    def requeue(self, messages: Iterable[MessageProxy]) -> None:
        for message in messages:
            self._settle(message, "pending", None)

    def _settle(self, message: Any, status: str, error: str | None) -> None:
        self.broker.settle(message, status, error)
        delivery = message.options.get("pg_delivery")
        # Only this delivery's hold: an older delivery's late ack must not free the room of a newer one.
        if delivery is not None and self.held.get(message.message_id) == delivery:
            del self.held[message.message_id]
        self.wake.poke()

    def close(self) -> None:
        self.broker.listener.unsubscribe(self.queue, self.wake)
        # Claimed but never handed to a worker thread: back to the queue.
        for proxy in list(self.ready):
            self._settle(proxy, "pending", None)
        self.ready.clear()
        try:
            self.broker.deliveries.write()
        except ConveyorError:
            pass  # kept in the outbox: the next consumer or the broker's close writes it
