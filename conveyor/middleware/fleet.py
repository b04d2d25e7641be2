"""The worker's side of the Workers page and the attempt history (see :mod:`conveyor.brokers.fleet`).

At the first worker boot of a process it registers the process (host, pid,
queues, threads, version) and starts a thread that refreshes the entry
every :func:`~conveyor.brokers.fleet.beat_interval` with what runs now and
the counts since start, and marks gone the workers that stopped beating
(any live worker does; the store makes that idempotent). Each attempt's
start and end (with the traceback of a failure, secret values scrubbed
before it leaves the process) go through a buffer that the same thread
writes every :data:`FLUSH_SECONDS`, so a job costs the store no round trip
of its own.

Nothing here decides a job's fate: a store that cannot be written is
logged and retried, never raised into Dramatiq (which would swallow it).
If the process dies, what the buffer held is lost — at most
``FLUSH_SECONDS`` of history; an attempt whose end never arrives shows as
lost with its worker.
"""

from __future__ import annotations

import dataclasses
import itertools
import os
import socket
import threading
import time
import traceback
import uuid
from collections import deque
from typing import TYPE_CHECKING, Any

from dramatiq import Broker, Worker
from dramatiq.broker import MessageProxy
from dramatiq.common import q_name

from conveyor.brokers.base import CANCELLED, ConveyorBroker, EnqueueItem, JobRef, describe_error
from conveyor.brokers.fleet import TRACEBACK_LIMIT, AttemptEvent, WorkerInfo, beat_interval, fleet_store, recovery_after
from conveyor.errors import RetryLater
from conveyor.logs import log_error
from conveyor.middleware.base import ConveyorMiddleware
from conveyor.redaction import payload_secrets, scrub, settings_secrets
from conveyor.version import __version__

if TYPE_CHECKING:
    from conveyor.app import App

#: Seconds between writes of buffered attempt events.
FLUSH_SECONDS = 0.05

#: Jobs in flight changed: the entry is refreshed this soon (s), not only at the next beat.
CHANGE_BEAT_SECONDS = 1.0

#: Buffered events beyond this are dropped (oldest first) while the store is away.
MAX_BUFFER = 10000


class Fleet(ConveyorMiddleware):
    """Registers this worker process, heartbeats it, and records every attempt."""

    def __init__(self, app: "App") -> None:
        self.app = app
        self._tag = uuid.uuid4().hex[:8]
        self.worker_id = f"{socket.gethostname()}:{os.getpid()}:{self._tag}"
        self._tokens = itertools.count(1)
        self._lock = threading.Lock()
        self._workers: dict[int, tuple[list[str], int]] = {}
        self._running: dict[int, tuple[str, str, str, int, float]] = {}
        self._events: deque[tuple[float, AttemptEvent]] = deque(maxlen=MAX_BUFFER)
        self._done = 0
        self._failed = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._secrets: list[str] | None = None
        self._warned_at = -1e9
        self._changed = False

    # -- the process --------------------------------------------------------------

    def after_worker_boot(self, broker: Broker, worker: Worker) -> None:
        queues = sorted(q for q in (worker.consumer_whitelist or broker.get_declared_queues()) if q == q_name(q))
        with self._lock:
            self._workers[id(worker)] = (queues, _concurrency(worker))
            if self._thread is None:
                self._stop.clear()
                self._thread = threading.Thread(target=self._run, name="conveyor-fleet", daemon=True)
                self._thread.start()
        self._beat()

    def after_worker_shutdown(self, broker: Broker, worker: Worker) -> None:
        with self._lock:
            self._workers.pop(id(worker), None)
            last = not self._workers
            thread, self._thread = (self._thread, None) if last else (None, self._thread)
        if not last:
            self._beat()
            return
        self._stop.set()
        if thread is not None:
            thread.join(5)
        self._flush()
        try:
            fleet_store(self.app).leave(self._info(), "stopped")
        except Exception as exc:
            log_error(f"worker registry not updated at shutdown: {type(exc).__name__}: {exc}")

    def _info(self) -> WorkerInfo:
        with self._lock:
            queues = sorted({q for qs, _ in self._workers.values() for q in qs})
            threads = sum(t for _, t in self._workers.values())
            in_flight = sorted({job_id for job_id, *_ in self._running.values()})
            done, failed = self._done, self._failed
        host, pid = self.worker_id.split(":")[:2]
        return WorkerInfo(
            id=self.worker_id,
            host=host,
            pid=int(pid),
            queues=queues,
            threads=threads,
            version=__version__,
            started_at=None,
            heartbeat_at=None,
            in_flight=in_flight,
            done=done,
            failed=failed,
        )

    def _beat(self) -> None:
        store = fleet_store(self.app)
        try:
            store.beat(self._info(), keep=24 * 3600)
            gone_after = recovery_after(self.app)
            if gone_after is not None:
                store.sweep(gone_after)
        except Exception as exc:
            log_error(f"worker heartbeat not written: {type(exc).__name__}: {exc}")

    def _run(self) -> None:
        interval = beat_interval(self.app)
        soon = min(interval, CHANGE_BEAT_SECONDS)
        last = time.monotonic()
        while not self._stop.wait(FLUSH_SECONDS):
            self._flush()
            now = time.monotonic()
            # Beat on schedule, or sooner (at most every CHANGE_BEAT_SECONDS) when jobs started or ended.
            if now - last >= interval or (self._changed and now - last >= soon):
                last = now
                self._changed = False
                self._beat()

    # -- enqueues ------------------------------------------------------------------

    def after_enqueue_jobs(self, broker: ConveyorBroker, items: list[EnqueueItem], refs: list[JobRef]) -> None:
        """Add the batch's new jobs to the fleet's enqueue totals, where the broker does not count them in
        its enqueue itself (Redis and Postgres do, exactly: this is the in-process store's).

        Called by the JobQueue once the jobs are in: they stay enqueued
        whatever happens here, so a failure is logged, never raised.
        """
        try:
            store = fleet_store(self.app)
        except Exception as exc:
            log_error(f"enqueue totals not counted: {type(exc).__name__}: {exc}")
            return
        if store.counts_enqueues:
            return
        counts: dict[tuple[str, str], int] = {}
        for item, ref in zip(items, refs):
            if not ref.deduplicated:
                key = (q_name(item.message.queue_name), item.message.actor_name)
                counts[key] = counts.get(key, 0) + 1
        if not counts:
            return
        try:
            store.count_enqueued(counts)
        except Exception as exc:
            log_error(f"enqueue totals not counted for {sum(counts.values())} job(s): {type(exc).__name__}: {exc}")

    # -- attempts -----------------------------------------------------------------

    def before_process_message(self, broker: Broker, message: MessageProxy) -> None:
        # Unique across workers and deliveries: this process's tag and a count.
        token = f"{self._tag}.{next(self._tokens)}"
        attempt = int(message.options.get("attempt", 0))
        now = time.monotonic()
        with self._lock:
            self._running[id(message)] = (message.message_id, token, q_name(message.queue_name), attempt, now)
            self._events.append((now, AttemptEvent("start", message.message_id, token, attempt, self.worker_id)))
            self._changed = True

    def after_process_message(
        self, broker: Broker, message: MessageProxy, *, result: Any = None, exception: BaseException | None = None
    ) -> None:
        if message.options.get(CANCELLED):
            self._end(message, "cancelled")  # the attempt's history says so (conveyor.middleware.cancel)
            return
        if exception is None:
            self._end(message, "completed")
            return
        secrets = self._secrets_of(message)
        error = scrub(describe_error(exception), secrets)
        if isinstance(exception, RetryLater):
            self._end(message, "deferred", error)
        else:
            self._end(message, "failed", error, self._traceback(exception, secrets))

    def after_skip_message(self, broker: Broker, message: MessageProxy) -> None:
        self._end(message, "cancelled" if message.options.get(CANCELLED) else "skipped")

    def _end(self, message: MessageProxy, outcome: str, error: str | None = None, trace: str | None = None) -> None:
        now = time.monotonic()
        with self._lock:
            running = self._running.pop(id(message), None)
            if running is None:
                return
            job_id, token, _, attempt, _ = running
            self._changed = True
            if outcome == "completed":
                self._done += 1
            elif outcome == "failed":
                self._failed += 1
            self._events.append(
                (
                    now,
                    AttemptEvent(
                        "end", job_id, token, attempt, self.worker_id, outcome=outcome, error=error, traceback=trace
                    ),
                )
            )

    def _secrets_of(self, message: MessageProxy) -> list[str]:
        """Secret values an error of this message may carry: the settings' and the payload's."""
        if self._secrets is None:
            self._secrets = settings_secrets(*self.app.all_settings)
        job_type = self.app.job_types.get(message.actor_name)
        payload = (message.args or [None])[0]
        return [*self._secrets, *payload_secrets(payload, job_type.payload if job_type else None)]

    def _traceback(self, exception: BaseException, secrets: list[str]) -> str:
        """The formatted traceback, secret values replaced, its tail kept."""
        text = "".join(traceback.format_exception(type(exception), exception, exception.__traceback__))
        text = scrub(text, secrets) or ""
        return text[-TRACEBACK_LIMIT:]

    def _flush(self) -> None:
        with self._lock:
            if not self._events:
                return
            taken = list(self._events)
            self._events.clear()
        events = _coalesced(taken, time.monotonic())
        try:
            fleet_store(self.app).write_attempts(events, keep=self.app.settings.retention)
        except Exception as exc:
            with self._lock:  # keep them for the next flush, oldest first
                self._events.extendleft(reversed(taken))
            if time.monotonic() - self._warned_at > 10:  # once in a while, not every flush
                self._warned_at = time.monotonic()
                log_error(f"attempt history not written yet ({len(taken)} events): {type(exc).__name__}: {exc}")


def _coalesced(taken: list[tuple[float, AttemptEvent]], now: float) -> list[AttemptEvent]:
    """The buffered events dated by age, a start and its end in the same batch merged into one "full" write."""
    out: list[AttemptEvent] = []
    starts: dict[str, int] = {}
    for at, e in taken:
        age = max(0.0, now - at)
        if e.kind == "end" and e.token in starts:
            index = starts.pop(e.token)
            out[index] = dataclasses.replace(e, kind="full", age=age, start_age=out[index].age)
            continue
        if e.kind == "start":
            starts[e.token] = len(out)
        out.append(dataclasses.replace(e, age=age))
    return out


def _concurrency(worker: Worker) -> int:
    """The jobs ``worker`` runs at once at most: its slots on conveyor's worker (conveyor.tasks.releasing), else its threads."""
    return int(getattr(worker, "concurrency", worker.worker_threads))
