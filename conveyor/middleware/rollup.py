"""The process's side of the dashboard's charts (see :mod:`conveyor.brokers.rollup`).

Every enqueue, retry, start, end and final failure this process sees is
added, under a lock, to an in-memory tally per (queue, job type, second of
this process's monotonic clock): a dict update, no round trip. A thread
started at the first count writes the tallies every
``CONVEYOR_ROLLUP_FLUSH_SECONDS`` in one batched write, each group dated by
its age so the store's server clock files it under its minute.

Nothing here decides a job's fate, and nothing raises into Dramatiq: a
store that cannot be written keeps the flush (under the same id, so a
write that timed out but landed is not added twice) and tries again at the
next turn. A process that dies loses at most one flush interval of counts:
the charts are a rollup for people, not the record of jobs (that is the
broker's own counts, ``conveyor status``).
"""

from __future__ import annotations

import atexit
import itertools
import threading
import time
import uuid
import weakref
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from dramatiq import Broker, Message, Worker
from dramatiq.broker import MessageProxy
from dramatiq.common import q_name

from conveyor.brokers.base import CANCELLED, AnyMessage, ConveyorBroker, EnqueueItem, JobRef
from conveyor.brokers.rollup import KEEP_SECONDS, Tally, TallyGroup, bucket_of, rollup_store
from conveyor.logs import log_error
from conveyor.middleware.base import ConveyorMiddleware
from conveyor.middleware.metrics import READY_OPTION

if TYPE_CHECKING:
    from conveyor.app import App

#: Tallies (queue, job type, second) held at most while the store is away; the oldest go first.
MAX_TALLIES = 20000


@dataclass
class _Flush:
    """A flush taken from the tallies, kept (with its id) until the store has it."""

    id: str
    tallies: dict[tuple[str, str, int], Tally]


class Rollup(ConveyorMiddleware):
    """Counts what happens to jobs per minute for the dashboard's charts, flushed in batches."""

    def __init__(self, app: "App") -> None:
        self.app = app
        self.interval = app.settings.rollup_flush_seconds
        self._tag = uuid.uuid4().hex[:12]
        self._seq = itertools.count(1)
        self._lock = threading.Lock()
        self._tallies: dict[tuple[str, str, int], Tally] = {}
        self._pending: _Flush | None = None
        self._running: dict[int, float] = {}
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._flush_lock = threading.Lock()
        self._warned_at = -1e9
        self._closed = False

    @property
    def enabled(self) -> bool:
        return self.interval > 0

    # -- counting (the hot path: a lock and a dict update) --------------------------

    def _tally(self, queue: str, job: str) -> Tally:
        """The current second's tally of (queue, job); the caller holds the lock."""
        key = (queue, job, int(time.monotonic()))
        tally = self._tallies.get(key)
        if tally is None:
            if len(self._tallies) >= MAX_TALLIES:
                del self._tallies[next(iter(self._tallies))]  # the store is away: the oldest go
            tally = self._tallies[key] = Tally()
            if self._thread is None and not self._closed:
                self._start()
        return tally

    def _start(self) -> None:
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="conveyor-rollup", daemon=True)
        self._thread.start()
        # A producer that exits (a CLI enqueue) still writes what it counted.
        atexit.register(_flush_at_exit, weakref.ref(self))

    def after_enqueue_jobs(self, broker: ConveyorBroker, items: list[EnqueueItem], refs: list[JobRef]) -> None:
        if not self.enabled:
            return
        with self._lock:
            for item, ref in zip(items, refs):
                if not ref.deduplicated:
                    self._tally(q_name(item.message.queue_name), item.message.actor_name).enqueued += 1

    def after_enqueue(self, broker: Broker, message: Message[Any], delay: int) -> None:
        # A retry is the one enqueue that carries the attempt it follows and a delay (as Metrics counts it).
        if self.enabled and delay is not None and "attempt" in message.options:
            with self._lock:
                self._tally(q_name(message.queue_name), message.actor_name).retried += 1

    def before_process_message(self, broker: Broker, message: MessageProxy) -> None:
        if not self.enabled:
            return
        ready_ms = message.options.get(READY_OPTION) or message.message_timestamp
        wait = max(0.0, time.time() - ready_ms / 1000)
        with self._lock:
            self._tally(q_name(message.queue_name), message.actor_name).wait[bucket_of(wait)] += 1
            self._running[id(message)] = time.monotonic()

    def after_process_message(
        self, broker: Broker, message: MessageProxy, *, result: Any = None, exception: BaseException | None = None
    ) -> None:
        if not self.enabled:
            return
        with self._lock:
            started = self._running.pop(id(message), None)
            if started is None:
                return
            tally = self._tally(q_name(message.queue_name), message.actor_name)
            tally.run[bucket_of(time.monotonic() - started)] += 1
            # A failed attempt counts as retried (after_enqueue) or failed for good (after_job_dead);
            # a RetryLater deferral as neither.
            if exception is None and not message.options.get(CANCELLED):
                tally.completed += 1

    def after_skip_message(self, broker: Broker, message: MessageProxy) -> None:
        with self._lock:
            self._running.pop(id(message), None)

    def after_job_dead(self, broker: ConveyorBroker, message: AnyMessage, error: str) -> None:
        if self.enabled:
            with self._lock:
                self._tally(q_name(message.queue_name), message.actor_name).failed += 1

    def after_worker_shutdown(self, broker: Broker, worker: Worker) -> None:
        self.flush()

    # -- flushing ---------------------------------------------------------------------

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.flush()

    def close(self) -> None:
        """Stop the flush thread and write what is left; nothing is counted or written after (``App.close``).

        Before the App closes its pool and broker: a flush after that would open them again.
        """
        self._stop.set()
        thread, self._thread = self._thread, None
        if thread is not None:
            thread.join(5)
        self.flush(quiet=True)
        self._closed = True

    def flush(self, *, quiet: bool = False) -> bool:
        """Write what was counted (and any flush the store missed); False when the store could not be written."""
        with self._flush_lock:
            if self._closed:
                return True
            with self._lock:
                if self._pending is None and self._tallies:
                    self._pending = _Flush(f"{self._tag}.{next(self._seq)}", self._tallies)
                    self._tallies = {}
                pending = self._pending
            if pending is None:
                return True
            now = time.monotonic()
            # Ages from now, each second's middle; a retried flush is dated the same way, to the same minutes.
            groups = [
                TallyGroup(queue, job, max(0.0, now - second - 0.5), tally)
                for (queue, job, second), tally in pending.tallies.items()
                if now - second < KEEP_SECONDS
            ]
            try:
                rollup_store(self.app).write(pending.id, groups)
            except Exception as exc:
                if not quiet and time.monotonic() - self._warned_at > 30:  # once in a while, not every flush
                    self._warned_at = time.monotonic()
                    log_error(f"chart history not written yet ({len(groups)} groups): {type(exc).__name__}: {exc}")
                return False
            with self._lock:
                self._pending = None
            return True


def _flush_at_exit(ref: "weakref.ref[Rollup]") -> None:
    rollup = ref()
    if rollup is not None:
        rollup._stop.set()
        rollup.flush(quiet=True)  # the store may be away already: nothing to tell at exit


def find_rollup(broker: Broker) -> Rollup | None:
    """The broker's :class:`Rollup` middleware, if it has one."""
    return next((m for m in broker.middleware if isinstance(m, Rollup)), None)
