"""The read layer of the admin API and dashboard: plain dataclasses, no HTTP.

It asks the broker (any :class:`~conveyor.brokers.base.ConveyorBroker`)
and returns what people may see: payload secrets redacted, errors
scrubbed of secret values. The routes in ``admin.py`` and ``dashboard.py``
only render what it returns; operator actions go through it too, so the
HTTP side never touches the broker.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..brokers.base import JOB_STATES, JobRecord
from ..errors import JobNotFound, JobStateConflict, UnknownQueue
from ..logs import log_event
from ..redaction import payload_secrets, redact_payload, scrub, settings_secrets

if TYPE_CHECKING:
    from ..app import App

#: Most jobs one page lists.
MAX_PAGE = 500


@dataclass(frozen=True)
class QueueView:
    """One queue's counts and settings, as the dashboard's overview shows them."""

    name: str
    concurrency: int
    max_attempts: int
    waiting: int
    delayed: int
    active: int
    failed: int
    completed_total: int
    failed_total: int
    paused: bool
    #: Seconds the oldest waiting job has waited; None when none waits.
    oldest_waiting_seconds: float | None


@dataclass(frozen=True)
class JobView:
    """A job as people may see it: the payload's secret fields redacted, the error scrubbed."""

    id: str
    queue: str
    job: str
    state: str
    attempts: int
    max_attempts: int | None
    key: str | None
    payload: dict[str, Any]
    error: str | None
    enqueued_at: float | None
    started_at: float | None
    finished_at: float | None
    eta: float | None

    @property
    def run_seconds(self) -> float | None:
        """Run time of the last attempt, once it finished."""
        if self.started_at and self.finished_at and self.finished_at >= self.started_at:
            return self.finished_at - self.started_at
        return None

    @property
    def wait_seconds(self) -> float | None:
        """Time from first enqueue to the last start (retries' backoff included)."""
        if self.enqueued_at and self.started_at and self.started_at >= self.enqueued_at:
            return self.started_at - self.enqueued_at
        return None


@dataclass(frozen=True)
class JobPage:
    """One page of a queue's jobs in one state, newest first. ``next_cursor`` is None on the last page."""

    queue: str
    state: str
    jobs: list[JobView]
    cursor: str | None
    next_cursor: str | None


class Inspector:
    """What the admin side may see and do, on the app's broker."""

    def __init__(self, app: "App") -> None:
        self.app = app
        self._settings_secrets = settings_secrets(app.settings)

    @property
    def broker(self):
        return self.app.broker

    # -- reading -----------------------------------------------------------------

    def queues(self) -> list[QueueView]:
        """Every queue with its counts, in the queue table's order."""
        now = time.time()
        views = []
        for name, spec in self.app.queues.items():
            c = self.broker.queue_counts(name)
            views.append(QueueView(
                name=name, concurrency=spec.concurrency, max_attempts=spec.max_attempts,
                waiting=c.waiting, delayed=c.delayed, active=c.active, failed=c.failed,
                completed_total=c.completed_total, failed_total=c.failed_total, paused=c.paused,
                oldest_waiting_seconds=max(0.0, now - c.oldest_waiting_at) if c.oldest_waiting_at else None,
            ))
        return views

    def queue(self, name: str) -> QueueView:
        self._check_queue(name)
        return next(q for q in self.queues() if q.name == name)

    def jobs(self, queue: str, state: str, *, limit: int = 50, cursor: str | None = None) -> JobPage:
        """A page of jobs. ``cursor`` is the ``next_cursor`` of the page before (opaque to callers)."""
        self._check_queue(queue)
        if state not in JOB_STATES:
            raise ValueError(f"unknown state {state!r}; states: {', '.join(JOB_STATES)}")
        limit = max(1, min(limit, MAX_PAGE))
        offset = _offset(cursor)
        # One more than asked: whether it comes back says if there is a next page.
        records = self.broker.list_jobs(queue, state, limit=limit + 1, offset=offset)
        more = len(records) > limit
        return JobPage(queue, state, [self._view(r) for r in records[:limit]], cursor,
                       str(offset + limit) if more else None)

    def job(self, job_id: str) -> JobView:
        """One job; :class:`JobNotFound` when there is none."""
        record = self.broker.get_job(job_id)
        if record is None:
            raise JobNotFound(f"no job {job_id!r}")
        return self._view(record)

    # -- acting ------------------------------------------------------------------

    def retry(self, job_id: str) -> JobView:
        """Put a failed job back in its queue with a fresh attempt budget."""
        before = self.job(job_id)
        if before.state != "failed":
            raise JobStateConflict(f"job {job_id} is {before.state}: only failed jobs can be retried")
        if not self.broker.retry_job(job_id):
            raise JobStateConflict(f"job {job_id} changed state before it could be retried")
        self._audit("admin_retry", before)
        return self.job(job_id)

    def retry_failed(self, queue: str) -> int:
        """Retry every failed job of ``queue``; returns how many."""
        self._check_queue(queue)
        count = self.broker.retry_failed(queue)
        log_event("admin_retry_failed", queue=queue, job=None, job_id=None, attempt=None, count=count)
        return count

    def delete(self, job_id: str) -> None:
        """Remove a job that is not running."""
        before = self.job(job_id)
        if before.state == "active":
            raise JobStateConflict(f"job {job_id} is running: it can be deleted once it has finished")
        if not self.broker.delete_job(job_id):
            raise JobStateConflict(f"job {job_id} changed state before it could be deleted")
        self._audit("admin_delete", before)

    def pause(self, queue: str) -> QueueView:
        self._check_queue(queue)
        self.broker.pause_queue(queue)
        log_event("admin_pause", queue=queue, job=None, job_id=None, attempt=None)
        return self.queue(queue)

    def resume(self, queue: str) -> QueueView:
        self._check_queue(queue)
        self.broker.resume_queue(queue)
        log_event("admin_resume", queue=queue, job=None, job_id=None, attempt=None)
        return self.queue(queue)

    # -- helpers -----------------------------------------------------------------

    def _check_queue(self, name: str) -> None:
        if name not in self.app.queues:
            raise UnknownQueue(f"no queue {name!r}; queues: {', '.join(self.app.queues)}")

    def _view(self, record: JobRecord) -> JobView:
        job_type = self.app.job_types.get(record.job)
        model = job_type.payload if job_type else None
        secrets = [*self._settings_secrets, *payload_secrets(record.payload, model)]
        max_attempts = None
        if job_type:
            max_attempts = job_type.max_attempts or self.app.queues[job_type.queue].max_attempts
        return JobView(
            id=record.id, queue=record.queue, job=record.job, state=record.state, attempts=record.attempts,
            max_attempts=max_attempts, key=record.key, payload=redact_payload(record.payload, model),
            error=scrub(record.error, secrets), enqueued_at=record.enqueued_at, started_at=record.started_at,
            finished_at=record.finished_at, eta=record.eta,
        )

    def _audit(self, event: str, job: JobView) -> None:
        log_event(event, queue=job.queue, job=job.job, job_id=job.id, attempt=job.attempts, state=job.state)


#: Largest page offset a cursor may hold: far past any real list, well inside a BIGINT.
MAX_OFFSET = 10**9


def _offset(cursor: str | None) -> int:
    # The message never quotes the cursor: whatever a client sent is not echoed back.
    if not cursor:
        return 0
    if not (cursor.isascii() and cursor.isdigit() and len(cursor) <= 10) or int(cursor) > MAX_OFFSET:
        raise ValueError("cursor: not a cursor this API gave out (pass nextCursor as it came)")
    return int(cursor)
