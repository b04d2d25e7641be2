"""In-process broker for desktop and single-user use, and for fast tests.

Same actors, same middleware, same per-queue concurrency (one Dramatiq
worker per queue inside the process, see :class:`~conveyor.tasks.worker.InlineWorkers`).
**Nothing persists**: jobs waiting when the process exits are lost, and
there is no other process to recover them. Use redis or postgres for
anything that must survive a restart.
"""

from __future__ import annotations

import heapq
import itertools
import queue
import threading
import time
from collections import defaultdict
from dataclasses import replace
from typing import TYPE_CHECKING, Any, Iterable

from dramatiq import Consumer, Message, Middleware
from dramatiq.broker import MessageProxy
from dramatiq.brokers.stub import StubBroker, _StubConsumer
from dramatiq.common import q_name

from conveyor.brokers.base import (
    CANCELLED,
    CANCELLED_AT_START,
    MAX_GROUPS,
    AnyMessage,
    CancelListener,
    CancelOutcome,
    Capabilities,
    ConveyorBroker,
    EnqueueItem,
    GroupCounts,
    JobRecord,
    JobRef,
    PoolOwner,
    QueueCounts,
    QueueGroups,
    SafeMessageProxy,
    as_message,
    busiest_first,
    check_state,
    priority_of,
)
from conveyor.events import PARK, TIMED_OUT

if TYPE_CHECKING:
    from collections.abc import Callable

    from conveyor.brokers.base import FinalFailure
    from conveyor.brokers.fleet.base import FleetStore
    from conveyor.brokers.rollup.base import RollupStore
    from conveyor.settings import Settings


class _RankedQueue(queue.Queue):  # type: ignore[type-arg]
    """A queue's ready messages, lowest rank first: the time it was put minus priority x aging
    (the rule of the Redis and Postgres brokers; FIFO within a priority). Entries are
    ``(rank, -priority, seq, encoded message)``; ``queue`` is the heap, as Dramatiq's code reads it."""

    def __init__(self, aging: Callable[[], float]) -> None:
        self._aging = aging
        self._seq = itertools.count()
        super().__init__()

    def _init(self, maxsize: int) -> None:
        self.queue: list[tuple[float, int, int, bytes]] = []

    def _qsize(self) -> int:
        return len(self.queue)

    def _put(self, item: bytes) -> None:
        p = priority_of(Message.decode(item))
        heapq.heappush(self.queue, (time.time() - p * self._aging(), -p, next(self._seq), item))

    def _get(self) -> bytes:
        return heapq.heappop(self.queue)[3]


class InlineBroker(ConveyorBroker, StubBroker):
    """Dramatiq's in-memory broker plus conveyor's records, keys and pausing."""

    #: Seconds of waiting one priority level is worth (CONVEYOR_PRIORITY_AGING_SECONDS; the App sets it).
    priority_aging: float = 60.0

    #: One process holds every job in its memory: its workers live in the process that enqueues, no worker
    #: can die and leave jobs behind (no recovery), no delivery is ever superseded (no fence), a message never
    #: leaves the process that encoded it (always decodes), and a queue is Dramatiq's in-memory FIFO.
    capabilities = Capabilities(store="memory", in_process=True, recovery=False, fence=False, stored_messages=False)

    @classmethod
    def from_settings(
        cls,
        settings: Settings,
        *,
        middleware: list[Middleware],
        on_dead: FinalFailure | None,
        database_url: Callable[[], str],
    ) -> InlineBroker:
        broker = cls(middleware=middleware)
        broker.priority_aging = settings.priority_aging_seconds
        return broker

    def fleet_store(self, pools: PoolOwner) -> FleetStore:
        from conveyor.brokers.fleet.memory_store import MemoryFleetStore

        return MemoryFleetStore(self)

    def rollup_store(self, pools: PoolOwner) -> RollupStore:
        from conveyor.brokers.rollup.memory_store import MemoryRollupStore

        return MemoryRollupStore()

    def __init__(self, middleware: list[Middleware]) -> None:
        super().__init__(middleware=middleware, fail_fast_default=False)
        self._lock = threading.RLock()
        self.records: dict[str, JobRecord] = {}
        self._keys: dict[str, tuple[str, float]] = {}
        self._totals: dict[str, dict[str, int]] = defaultdict(lambda: {"completed": 0, "failed": 0})
        self._final: set[str] = set()
        self._deleted: set[str] = set()
        self._cancel_asked: set[str] = set()
        self._cancel_listeners: list[_InlineCancels] = []
        self._waiting_since: dict[str, float] = {}
        self.paused: set[str] = set()
        #: job id -> its deliveries so far: the fence number of the latest (``inline_delivery`` on its message).
        self._deliveries: dict[str, int] = {}
        #: job id -> the message of its delay (stamped ``inline_delay``), until that delay ends or is cut short.
        self._delayed: dict[str, Message[Any]] = {}
        #: ``inline_delay`` stamps of delays an operator cut short: their copies coming back are dropped.
        self._promoted: set[int] = set()
        self._delay_stamps = itertools.count(1)
        #: Waits for events (conveyor.events): kept signals (name -> resolution, monotonic expiry), each
        #: job's resolutions by (job id, name), and the event each awaiting job waits for.
        self._events: dict[str, tuple[str, float]] = {}
        self._resolutions: dict[tuple[str, str], str] = {}
        self._awaiting: dict[str, str] = {}
        #: queue -> group -> weight stored by set_group_weight (kept and reported; one process runs every inline
        #: job in queue order, so weights, like the groups themselves, never reorder them).
        self._weights: dict[str, dict[str, int]] = defaultdict(dict)

    def declare_queue(self, queue_name: str) -> None:
        """Dramatiq's declaration; a queue's (not a delay queue's) messages are then ranked by priority."""
        fresh = queue_name not in self.queues
        super().declare_queue(queue_name)
        if fresh:
            self.queues[queue_name] = _RankedQueue(lambda: self.priority_aging)

    def consume(self, queue_name: str, prefetch: int = 1, timeout: int = 100) -> _Consumer:
        consumer = super().consume(queue_name, prefetch, timeout)
        assert isinstance(consumer, _StubConsumer)  # what StubBroker.consume returns
        return _Consumer(self, queue_name, consumer)

    def enqueue(self, message: Message[Any], *, delay: int | None = None) -> Message[Any]:
        message = as_message(message)  # a middleware's proxy (Dramatiq's stock Retries passes it)
        with self._lock:
            if message.message_id in self._deleted:
                return message  # a deleted job coming back from its delay: drop it
            cancelled = self.records.get(message.message_id)
            if cancelled is not None and cancelled.state == "cancelled":
                return message  # a cancelled job coming back from its delay, or retried: it never runs
            stamp = message.options.get("inline_delay")
            if delay is None and stamp in self._promoted:
                self._promoted.discard(stamp)  # a delay an operator cut short coming back: it ran already
                return message
            event = message.options.get(PARK)
            if event is not None:
                message = _without(message, PARK)
                kept = self._kept(event)
                if kept is not None:  # a signal came first: resolved at once
                    self._resolutions.setdefault((message.message_id, event), kept)
                    event, delay = None, None
            if delay is not None:
                message = message.copy(options={"inline_delay": next(self._delay_stamps)})
            elif stamp is not None:
                message = _without(message, "inline_delay")
            sent = super().enqueue(message, delay=delay)
            if delay is not None:
                self._delayed[message.message_id] = sent
            else:
                self._delayed.pop(message.message_id, None)
            record = self.records.get(message.message_id)
            if record is None:
                record = self.records[message.message_id] = JobRecord(
                    id=message.message_id,
                    queue=q_name(message.queue_name),
                    job=message.actor_name,
                    state="waiting",
                    key=message.options.get("key"),
                    payload=(message.args or [{}])[0],
                    enqueued_at=time.time(),
                    priority=priority_of(message),
                    group=message.options.get("group") or None,
                )
            record.state = "delayed" if delay is not None else "waiting"
            if event is not None:
                record.state, record.event = "awaiting", event
                self._awaiting[record.id] = event
            else:
                self._awaiting.pop(record.id, None)
                record.event = None
            if delay is None:
                self._waiting_since[record.id] = time.time()
            record.eta = sent.options.get("eta", 0) / 1000 if delay is not None else None
            if message.options.get("last_error"):
                record.error = message.options["last_error"]
            return sent

    def enqueue_jobs(self, items: list[EnqueueItem], *, dedup_ttl: float) -> list[JobRef]:
        refs: list[JobRef] = []
        with self._lock:
            now = time.monotonic()
            for item in items:
                if item.key:
                    holder = self._keys.get(item.key)
                    if holder and holder[1] > now and holder[0] in self.records:
                        refs.append(JobRef(holder[0], True))
                        continue
                    self._keys[item.key] = (item.message.message_id, now + dedup_ttl)
                self.enqueue(item.message, delay=item.delay_ms)
                record = self.records.get(item.message.message_id)
                if record is not None and item.key:
                    record.key = item.key  # the item's key, also when the message's options carry none
                refs.append(JobRef(item.message.message_id, False))
        return refs

    def start_job(self, message: AnyMessage) -> int:
        with self._lock:
            record = self.records.get(message.message_id)
            if record is None:
                return 0
            if message.message_id in self._cancel_asked:
                if record.state != "cancelled":
                    self._end_cancelled(record)
                message.options[CANCELLED] = True
                return CANCELLED_AT_START
            record.attempts += 1
            record.state = "active"
            self._waiting_since.pop(record.id, None)
            record.started_at = time.time()
            return record.attempts

    def claim_final_failure(self, message: AnyMessage) -> bool:
        with self._lock:
            if message.message_id in self._final:
                return False
            self._final.add(message.message_id)
            return True

    def deliver(self, message: Message[Any]) -> None:
        """A consumer hands ``message`` out: a new delivery of its job, numbered on its options."""
        with self._lock:
            delivery = self._deliveries[message.message_id] = self._deliveries.get(message.message_id, 0) + 1
        message.options["inline_delivery"] = delivery

    def delivery(self, message: AnyMessage) -> int | None:
        delivery: int | None = message.options.get("inline_delivery")
        return delivery

    def is_current(self, message: AnyMessage) -> bool:
        # One process holds every inline job and nothing takes one back: only a newer delivery supersedes.
        delivery = message.options.get("inline_delivery")
        with self._lock:
            return delivery is not None and self._deliveries.get(message.message_id) == delivery

    def finish(self, message: MessageProxy, *, failed: bool) -> None:
        """Called by the consumer on ack (``failed=False``) and nack."""
        if message.queue_name.endswith(".DQ"):
            return
        with self._lock:
            record = self.records.get(message.message_id)
            if record is None or record.state != "active" or message.options.get(CANCELLED):
                return
            record.state = "failed" if failed else "completed"
            record.finished_at = time.time()
            record.error = message.options.get("last_error") if failed else None
            self._totals[record.queue]["failed" if failed else "completed"] += 1

    def maintain(self) -> dict[str, list[str]]:
        # No other process can hold inline jobs: nothing to recover, only history to prune.
        return {}

    def queue_counts(self, queue: str) -> QueueCounts:
        with self._lock:
            states: defaultdict[str, int] = defaultdict(int)
            for record in self.records.values():
                if record.queue == queue:
                    states[record.state] += 1
            totals = self._totals[queue]
            since = [
                self._waiting_since[r.id]
                for r in self.records.values()
                if r.queue == queue and r.state == "waiting" and r.id in self._waiting_since
            ]
            return QueueCounts(
                queue,
                states["waiting"],
                states["delayed"],
                states["active"],
                states["failed"],
                totals["completed"],
                totals["failed"],
                queue in self.paused,
                min(since) if since else None,
                states["active"],  # an inline job is active from its start: none is prefetched
                states["cancelled"],
                awaiting=states["awaiting"],
            )

    def group_counts(self, queue: str, *, limit: int = 50) -> QueueGroups:
        # One process runs every inline job in queue order: its groups are only counted, never served apart.
        with self._lock:
            found: dict[str, GroupCounts] = {}
            for r in self.records.values():
                if r.queue != queue or not r.group or r.state not in ("waiting", "active"):
                    continue
                g = found.get(r.group) or GroupCounts(r.group)
                if r.state == "active":
                    g = replace(g, active=g.active + 1)
                else:
                    since = self._waiting_since.get(r.id)
                    oldest = g.oldest_waiting_at if since is None else min(since, g.oldest_waiting_at or since)
                    g = replace(g, waiting=g.waiting + 1, oldest_waiting_at=oldest)
                found[r.group] = g
        return QueueGroups(queue, busiest_first(list(found.values()), min(limit, MAX_GROUPS)), len(found))

    def get_job(self, job_id: str) -> JobRecord | None:
        with self._lock:
            record = self.records.get(job_id)
            return replace(record) if record else None

    def list_jobs(self, queue: str, state: str, *, limit: int = 50, offset: int = 0) -> list[JobRecord]:
        check_state(state)
        with self._lock:
            rows = [replace(r) for r in self.records.values() if r.queue == queue and r.state == state]
        rows.sort(key=lambda r: r.finished_at or r.started_at or r.enqueued_at or 0, reverse=True)
        return rows[offset : offset + limit]

    def pause_queue(self, queue: str) -> None:
        self.paused.add(queue)

    def resume_queue(self, queue: str) -> None:
        self.paused.discard(queue)

    def set_group_weight(self, queue: str, group: str, weight: int) -> None:
        with self._lock:
            self._weights[queue][group] = weight

    def stored_group_weights(self, queue: str) -> dict[str, int]:
        with self._lock:
            return {g: w for g, w in sorted(self._weights.get(queue, {}).items()) if w != 1}

    def retry_job(self, job_id: str) -> bool:
        with self._lock:
            record = self.records.get(job_id)
            if record is None or record.state != "failed":
                return False
            message = self._take_dead_letter(record)
            record.attempts = 0
            record.finished_at = None
            record.eta = None
            self._final.discard(job_id)
            self.enqueue(message)
            return True

    def retry_failed(self, queue: str) -> int:
        with self._lock:
            ids = [r.id for r in self.records.values() if r.queue == queue and r.state == "failed"]
            return sum(self.retry_job(job_id) for job_id in ids)

    def promote_job(self, job_id: str) -> bool:
        with self._lock:
            record = self.records.get(job_id)
            held = self._delayed.pop(job_id, None)
            if record is None or record.state not in ("delayed", "awaiting") or held is None:
                return False
            # Its delay copy is in the delay queue, or held by a worker until its eta: dropped either way.
            if not self._take_queued(held.queue_name, job_id):
                self._promoted.add(held.options["inline_delay"])
            self.enqueue(_without(held.copy(queue_name=record.queue), "eta", "inline_delay"))
            return True

    def _kept(self, name: str) -> str | None:
        kept = self._events.get(name)
        if kept is None or kept[1] <= time.monotonic():
            self._events.pop(name, None)
            return None
        return kept[0]

    def signal_event(self, name: str, resolution: str, ttl: float) -> int:
        with self._lock:
            waiting = [job_id for job_id, event in self._awaiting.items() if event == name]
            for job_id in waiting:
                self._resolutions.setdefault((job_id, name), resolution)
                self.promote_job(job_id)
            if self._kept(name) is None:
                self._events[name] = (resolution, time.monotonic() + ttl)
            return len(waiting)

    def resolve_wait(self, job_id: str, name: str, *, timed_out: bool) -> str | None:
        with self._lock:
            found = self._resolutions.get((job_id, name))
            if found is None and job_id in self.records:
                found = self._kept(name) or (TIMED_OUT if timed_out else None)
                if found is not None:
                    self._resolutions[(job_id, name)] = found
            return found

    def _take_queued(self, queue_name: str, job_id: str) -> bool:
        """Remove ``job_id``'s message from the in-memory queue ``queue_name``; False when it was not there."""
        queue = self.queues.get(queue_name)
        if queue is None:
            return False
        with queue.mutex:
            entries: Any = queue.queue
            kept = [e for e in entries if Message.decode(e[-1] if isinstance(e, tuple) else e).message_id != job_id]
            taken = len(entries) - len(kept)
            if taken:
                entries.clear()
                entries.extend(kept)
                if isinstance(queue, _RankedQueue):
                    heapq.heapify(entries)
                queue.unfinished_tasks -= taken  # as task_done() would, for join()
                if not queue.unfinished_tasks:
                    queue.all_tasks_done.notify_all()
            return taken > 0

    def delete_job(self, job_id: str) -> bool:
        with self._lock:
            record = self.records.get(job_id)
            if record is None or record.state == "active":
                return False
            if record.state == "failed":
                self._take_dead_letter(record)
            # A waiting or delayed message stays in its in-memory queue: the
            # tombstone makes start_job skip it and enqueue drop it.
            self._deleted.add(job_id)
            self._delayed.pop(job_id, None)
            del self.records[job_id]
            self._deliveries.pop(job_id, None)
            self._waiting_since.pop(job_id, None)
            if record.key and self._keys.get(record.key, ("",))[0] == job_id:
                del self._keys[record.key]
            return True

    def _end_cancelled(self, record: JobRecord) -> None:
        record.state = "cancelled"
        record.finished_at = time.time()
        self._waiting_since.pop(record.id, None)
        self._totals[record.queue]["cancelled"] = self._totals[record.queue].get("cancelled", 0) + 1

    def cancel_job(self, job_id: str) -> str | None:
        with self._lock:
            record = self.records.get(job_id)
            if record is None:
                return None
            if record.state in ("completed", "failed", "cancelled"):
                return CancelOutcome.FINISHED
            self._cancel_asked.add(job_id)
            if record.state == "active":
                for listener in self._cancel_listeners:
                    listener.push(job_id)
                return CancelOutcome.REQUESTED
            # Waiting or delayed: its message stays in its in-memory queue, and its start ends it.
            self._end_cancelled(record)
            self._delayed.pop(job_id, None)
            return CancelOutcome.CANCELLED

    def cancel_outcome(self, message: AnyMessage, error: str | None = None) -> bool:
        with self._lock:
            record = self.records.get(message.message_id)
            if record is None or record.state != "active" or message.message_id not in self._cancel_asked:
                return False
            self._end_cancelled(record)
            if error:
                record.error = error
            message.options[CANCELLED] = True
            return True

    def cancel_requested(self, job_ids: list[str]) -> set[str]:
        with self._lock:
            return {
                i
                for i in job_ids
                if i in self._cancel_asked and (r := self.records.get(i)) is not None and r.state == "active"
            }

    def cancel_listener(self) -> CancelListener | None:
        listener = _InlineCancels(self)
        with self._lock:
            self._cancel_listeners.append(listener)
        return listener

    def forget_cancel_listener(self, listener: "_InlineCancels") -> None:
        """A closed listener gets no more cancels."""
        with self._lock:
            if listener in self._cancel_listeners:
                self._cancel_listeners.remove(listener)

    def _take_dead_letter(self, record: JobRecord) -> Message[Any]:
        """The failed job's message, out of the dead letters (rebuilt from the record if absent)."""
        letters = self.dead_letters_by_queue[record.queue]
        for i, proxy in enumerate(letters):
            if proxy.message_id == record.id:
                del letters[i]
                return proxy._message
        options = {"key": record.key} if record.key else {}
        return Message(
            queue_name=record.queue,
            actor_name=record.job,
            args=(record.payload,),
            kwargs={},
            options=options,
            message_id=record.id,
        )


def _without(message: Message[Any], *names: str) -> Message[Any]:
    options = {k: v for k, v in message.options.items() if k not in names}
    return replace(message, options=options)


class _Consumer(Consumer):
    """Wraps Dramatiq's stub consumer: records outcomes and honours pausing."""

    def __init__(self, broker: InlineBroker, queue_name: str, inner: _StubConsumer) -> None:
        self.broker = broker
        self.queue_name = queue_name
        self.inner = inner

    def __next__(self) -> SafeMessageProxy | None:
        if q_name(self.queue_name) in self.broker.paused:
            time.sleep(self.inner.timeout / 1000)
            return None
        message = next(self.inner)
        if message is None:
            return None
        record = self.broker.records.get(message.message_id)
        if record is not None and record.state == "cancelled":
            self.inner.ack(message)  # cancelled while it waited in the in-memory queue: never handed out
            return None
        if not self.queue_name.endswith(".DQ"):
            self.broker.deliver(message._message)
        return SafeMessageProxy(message._message)

    def ack(self, message: MessageProxy) -> None:
        self.inner.ack(message)
        self.broker.finish(message, failed=False)

    def nack(self, message: MessageProxy) -> None:
        self.inner.nack(message)
        self.broker.finish(message, failed=True)

    def requeue(self, messages: Iterable[MessageProxy]) -> None:
        for message in messages:
            self.broker.queues[self.queue_name].put(message._message.encode())
            self.inner.ack(message)

    def close(self) -> None:
        self.inner.close()


class _InlineCancels:
    """The process's cancel channel (a cancel reaches its watcher in memory)."""

    def __init__(self, broker: InlineBroker) -> None:
        self.broker = broker
        # Its own lock, not the broker's: the broker pushes while holding its lock (broker, then this one).
        self._lock = threading.Lock()
        self.ids: list[str] = []
        self.event = threading.Event()

    def push(self, job_id: str) -> None:
        with self._lock:
            self.ids.append(job_id)
            self.event.set()

    def wait(self, timeout: float) -> list[str]:
        self.event.wait(timeout)
        with self._lock:
            self.event.clear()
            ids, self.ids = self.ids, []
        return ids

    def close(self) -> None:
        self.broker.forget_cancel_listener(self)
