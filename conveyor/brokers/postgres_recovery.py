"""Recovery for the Postgres broker: dead workers' jobs, final failures found outside a run, pruning.

Part of :class:`~conveyor.brokers.postgres.PostgresBroker` (a mixin, to keep
each module readable in one sitting). Every statement here is safe to run
from many worker processes at once.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time

from dramatiq import Message

from ..logs import log_event
from .base import describe_error

#: Rows per recovery or prune statement, and statements per pass: both stay off the hot path.
BATCH = 1000
BATCHES_PER_PASS = 10

#: Seconds between prune passes (the retention is days; no need to hurry).
PRUNE_INTERVAL = 60.0

#: Seconds after which a worker row that stopped heartbeating is forgotten.
FORGET_WORKERS_AFTER = 24 * 3600.0


class RecoveryMixin:
    """``maintain()`` and what it calls; needs the broker's ``_execute``, listener, outbox and held set."""

    def _fail_malformed(self, job_id: str, queue: str, job: str, delivery: int, exc: Exception) -> None:
        cause = getattr(exc, "error", None) or exc  # DecodeError wraps the decoder's error
        error = f"MalformedMessage: the stored message cannot be decoded ({describe_error(cause, 500)})"
        row = self._execute("fail_malformed", {"id": job_id, "delivery": delivery, "error": error,
                                               "slot": self._slot()}, fetch="one")
        with self._lock:
            self._held.pop(job_id, None)
        log_event("failed", level="error", queue=queue, job=job, job_id=job_id, attempt=None, error=error)
        if row and row[0]:
            self._run_on_dead(job_id, queue, job, None, 0, error)

    def _run_on_dead(self, job_id: str, queue: str, job: str, text: str | None, attempt: int, error: str) -> None:
        message = None
        if text is not None:
            with contextlib.suppress(Exception):
                message = dataclasses.replace(Message.decode(text.encode()), message_id=job_id, queue_name=queue)
        if message is None:  # the hook gets no payload
            message = Message(queue_name=queue, actor_name=job, args=(), kwargs={}, options={}, message_id=job_id)
        message.options["attempt"] = attempt
        if self._on_dead is None:
            return
        try:
            self._on_dead(self, message, error)
        except Exception as exc:
            log_event("error", level="error", queue=queue, job=job, job_id=job_id, attempt=attempt,
                      error=f"final-failure handling raised {type(exc).__name__}: {exc}")

    def maintain(self) -> dict[str, list[str]]:
        """Recovery (every ``CONVEYOR_PG_RECOVERY_SECONDS``) and pruning (every minute).

        Safe from many processes at once: each stuck row is taken by one pass.
        Skipped while this process's own connection came back less than a
        lease ago: after a Postgres restart every worker's heartbeat looks
        stale until each has had the time to write one.
        """
        if not self._maintaining.acquire(blocking=False):
            return {}
        try:
            now = time.monotonic()
            recovered: dict[str, list[str]] = {}
            up_since = self._listener.up_since
            settled = up_since is not None and now - up_since >= self.lease
            if now - self._last_recovery >= self.recovery_seconds and settled:
                self._last_recovery = now
                recovered = self.recover()
            if now - self._last_prune >= PRUNE_INTERVAL:
                self._last_prune = now
                self.prune()
                self._execute("forget_dead_workers", {"after": FORGET_WORKERS_AFTER})
            return recovered
        finally:
            self._maintaining.release()

    def recover(self) -> dict[str, list[str]]:
        """One recovery pass now; returns the ids put back to pending, by queue."""
        requeued: dict[str, list[str]] = {}
        for _ in range(BATCHES_PER_PASS):
            rows = self._execute("recover", {"lease": self.lease, "limit": BATCH, "slot": self._slot()},
                                 fetch="all")
            for job_id, queue, job, status, run_hook, attempt, error, text in rows:
                if status == "pending":
                    requeued.setdefault(queue, []).append(job_id)
                    continue
                log_event("failed", level="error", queue=queue, job=job, job_id=job_id, attempt=attempt, error=error)
                if run_hook:
                    self._run_on_dead(job_id, queue, job, text, attempt, error)
            if len(rows) < BATCH:
                break
        if self._listener.ready.is_set():
            with self._lock:
                held = set(self._held)
            held |= self._outbox.job_ids()
            for job_id, queue in self._execute("release_orphans", {"worker": self.worker_id, "lease": self.lease,
                                                                   "held": sorted(held)}, fetch="all"):
                requeued.setdefault(queue, []).append(job_id)
        return requeued

    def prune(self) -> int:
        """Delete finished jobs older than the retention, in batches; returns how many."""
        total = 0
        for _ in range(BATCHES_PER_PASS):
            count = self._execute("prune", {"retention": self.retention, "limit": BATCH})
            total += count
            if count < BATCH:
                break
        return total
