"""How the contract suite drives a broker: its consumer on a thread, and the protocol of one delivery.

Nothing here runs a conveyor worker or its middleware. :class:`Pump` does
for one queue what Dramatiq's consumer thread does (iterate the broker's
consumer, hold a message with an ``eta`` until it is due and then enqueue it
on its queue, ack what is done); :func:`retry` and :func:`fail` are the
calls conveyor's Retries middleware makes for a failed delivery. Each test
then sees only the broker's own answers: refs, attempts, records, counts.
"""

from __future__ import annotations

import heapq
import itertools
import queue
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

from dramatiq import Message
from dramatiq.common import current_millis, q_name

from conveyor.brokers.base import PRIORITY, EnqueueItem, JobRecord, JobRef

T = TypeVar("T")

#: The contract's queues and its one job type per queue.
QUEUE = "contract"
OTHER_QUEUE = "contract_other"
JOB = "contract.job"
OTHER_JOB = "contract.other"
#: On the first queue, claimed before ``JOB`` where the broker orders by priority (Dramatiq: lower first).
URGENT_JOB = "contract.urgent"

#: Dedup TTL (s) of keyed enqueues that must outlive the test.
LONG_TTL = 60.0

#: Milliseconds a consumer's next() may block: short, so that pumps stop promptly.
CONSUMER_TIMEOUT_MS = 100


def message(payload: dict | None = None, *, queue_name: str = QUEUE, job: str = JOB, priority: int = 0) -> Message:
    """A new message as conveyor's JobQueue builds one: the payload is the one positional argument."""
    options = {PRIORITY: priority} if priority else {}
    return Message(queue_name=queue_name, actor_name=job, args=(payload or {},), kwargs={}, options=options)


def enqueue(
    broker: Any,
    payload: dict | None = None,
    *,
    key: str | None = None,
    delay_ms: int | None = None,
    dedup_ttl: float = LONG_TTL,
    queue_name: str = QUEUE,
    job: str = JOB,
    priority: int = 0,
) -> JobRef:
    """One keyed or plain enqueue through ``enqueue_jobs``."""
    item = EnqueueItem(message(payload, queue_name=queue_name, job=job, priority=priority), key, delay_ms)
    (ref,) = broker.enqueue_jobs([item], dedup_ttl=dedup_ttl)
    return ref


def eventually(predicate: Callable[[], T], timeout: float = 10.0, what: str = "") -> T:
    """``predicate()`` once it is truthy; fails after ``timeout`` s. Outcomes may be written asynchronously."""
    deadline = time.monotonic() + timeout
    while True:
        result = predicate()
        if result:
            return result
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout:g}s waiting for {what or predicate} (last: {result!r})")
        time.sleep(0.02)


def drain(broker: Any, consumer: Any, count: int, field: str = "n") -> list[Any]:
    """Receive, start and ack ``count`` deliveries in turn; their payloads' ``field``, in the order handed out."""
    out = []
    for _ in range(count):
        delivered = consumer.receive()
        broker.start_job(delivered)
        consumer.ack(delivered)
        out.append(delivered.args[0][field])
    return out


def record_in(broker: Any, job_id: str, state: str, timeout: float = 10.0) -> JobRecord:
    """The job's record once it is in ``state``."""
    return eventually(
        lambda: (r := broker.get_job(job_id)) is not None and r.state == state and r,
        timeout,
        f"job {job_id} to be {state}",
    )


def retry(broker: Any, pump: Pump, delivered: Any, error: str, delay_ms: int) -> None:
    """The delivery failed and runs again after ``delay_ms``: re-enqueue it with its error, then ack it.

    The order and the calls are those of conveyor's Retries middleware
    (``broker.enqueue`` of the delivered message's copy) and Dramatiq's
    worker (the ack of a message that did not fail).
    """
    broker.enqueue(delivered.copy(options={"last_error": error}), delay=delay_ms)
    pump.ack(delivered)


def fail(broker: Any, pump: Pump, delivered: Any, error: str) -> bool:
    """The delivery failed for good: claim the final failure, then nack. Returns whether the claim was won."""
    delivered.fail()
    delivered.options["last_error"] = error
    won = broker.claim_final_failure(delivered)
    pump.nack(delivered)
    return won


class Pump:
    """One consumer of one queue on a thread of its own, as Dramatiq's consumer thread runs it.

    Messages the consumer hands out go to :meth:`receive`; one with an
    ``eta`` (from a delay queue) is held until it is due, then enqueued on
    its queue and acked, exactly as Dramatiq's ``handle_delayed_messages``
    does. Outcomes are sent with :meth:`ack` and :meth:`nack` (Dramatiq
    calls the consumer's from the consumer thread, conveyor's brokers take
    them from any thread).
    """

    def __init__(self, broker: Any, queue_name: str, prefetch: int = 1) -> None:
        #: The pump of this queue's delay queue, on a broker that has delay queues (Dramatiq's design:
        #: redis, inline hand out a delayed message from ``<queue>.DQ``); it stops and closes with this one.
        self.delays = [
            Pump(broker, name, prefetch=10)
            for name in sorted(broker.get_declared_delay_queues())
            if name.startswith(f"{queue_name}.")
        ]
        self.broker = broker
        self.queue_name = queue_name
        self.consumer = broker.consume(queue_name, prefetch=prefetch, timeout=CONSUMER_TIMEOUT_MS)
        self.inbox: queue.Queue[Any] = queue.Queue()
        self._delayed: list[tuple[int, int, Any]] = []
        self._order = itertools.count()
        self._stop = threading.Event()
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name=f"contract-pump-{queue_name}", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                self._promote_due()
                delivered = next(self.consumer)
                if delivered is None:
                    continue
                if delivered.options.get("eta") is not None:
                    heapq.heappush(self._delayed, (delivered.options["eta"], next(self._order), delivered))
                else:
                    self.inbox.put(delivered)
        except BaseException as exc:  # reported by the test that reads from this pump, not lost in a thread
            self.error = exc

    def _promote_due(self) -> None:
        while self._delayed and self._delayed[0][0] <= current_millis():
            _, _, delivered = heapq.heappop(self._delayed)
            due = delivered.copy(queue_name=q_name(delivered.queue_name))
            del due.options["eta"]
            self.broker.enqueue(due)
            self.consumer.ack(delivered)

    def receive(self, timeout: float = 10.0) -> Any:
        """The next message handed out; fails after ``timeout`` s."""
        try:
            return self.inbox.get(timeout=timeout)
        except queue.Empty:
            self._raise()
            raise AssertionError(f"nothing was delivered from {self.queue_name} within {timeout:g}s") from None

    def poll(self, timeout: float) -> Any:
        """The next message handed out within ``timeout`` s, else None."""
        try:
            return self.inbox.get(timeout=timeout)
        except queue.Empty:
            self._raise()
            return None

    def nothing(self, within: float | None = None, *, until: float | None = None) -> None:
        """Fails if a message is handed out within ``within`` s, or before ``until`` (``time.monotonic()``)."""
        if until is not None:
            within = until - time.monotonic()
        try:
            delivered = self.inbox.get(timeout=max(0.0, within or 0.0))
        except queue.Empty:
            self._raise()
            return
        raise AssertionError(f"{delivered.message_id} was delivered from {self.queue_name} too early")

    def ack(self, delivered: Any) -> None:
        self.consumer.ack(delivered)

    def nack(self, delivered: Any) -> None:
        self.consumer.nack(delivered)

    def requeue(self, delivered: list[Any]) -> None:
        self.consumer.requeue(delivered)

    def freeze(self) -> None:
        """Stop consuming and hand nothing back: what the consumer holds stays held (a worker that hangs)."""
        for pump in (self, *self.delays):
            pump._stop.set()
        for pump in (self, *self.delays):
            pump._thread.join(10)

    def close(self) -> None:
        """Stop, and close the consumer, which hands back what it fetched and handed to no one."""
        if not self._stop.is_set():
            self.freeze()
            for pump in (self, *self.delays):
                pump.consumer.close()
        for pump in (self, *self.delays):
            pump._raise()

    def _raise(self) -> None:
        if self.error is not None:
            raise AssertionError(f"the consumer of {self.queue_name} raised {self.error!r}") from self.error
