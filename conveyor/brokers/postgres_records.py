"""The Postgres broker's read side and operator actions: job records, queue counts, pause, retry, delete.

Part of :class:`~conveyor.brokers.postgres.PostgresBroker` (a mixin); it
returns the plain dataclasses of ``base.py`` and never prints payloads.
"""

from __future__ import annotations

from .base import JOB_STATES, JobRecord, QueueCounts
from .postgres_listen import CHANNEL

#: state -> (query, status parameter)
_LISTS = {
    "waiting": ("list_waiting", None),
    "delayed": ("list_delayed", None),
    "active": ("list_active", None),
    "completed": ("list_finished", "done"),
    "failed": ("list_finished", "failed"),
}


class RecordsMixin:
    """Reads, pause/resume and the dashboard's retry/delete; needs the broker's ``_read``."""

    def queue_counts(self, queue: str) -> QueueCounts:
        waiting, delayed, active, failed, completed_total, failed_total, paused, oldest = self._read(
            "counts", {"queue": queue}, "one")
        return QueueCounts(queue, waiting, delayed, active, failed, int(completed_total), int(failed_total), paused,
                           oldest)

    def get_job(self, job_id: str) -> JobRecord | None:
        row = self._read("get_job", {"id": job_id}, "one")
        return _record(row) if row else None

    def list_jobs(self, queue: str, state: str, *, limit: int = 50, offset: int = 0) -> list[JobRecord]:
        if state not in JOB_STATES:
            raise ValueError(f"unknown state {state!r}; states: {', '.join(JOB_STATES)}")
        name, status = _LISTS[state]
        rows = self._read(name, {"queue": queue, "status": status, "limit": limit, "offset": offset}, "all")
        return [_record(row) for row in rows]

    def pause_queue(self, queue: str) -> None:
        self._read("pause", {"queue": queue}, "none")

    def resume_queue(self, queue: str) -> None:
        self._read("resume", {"queue": queue, "channel": CHANNEL}, "none")

    # -- operator actions --------------------------------------------------------

    def retry_job(self, job_id: str) -> bool:
        retried, _ = self._read("retry_failed", {"id": job_id, "queue": None, "channel": CHANNEL}, "one")
        return retried > 0

    def retry_failed(self, queue: str) -> int:
        retried, _ = self._read("retry_failed", {"id": None, "queue": queue, "channel": CHANNEL}, "one")
        return retried

    def delete_job(self, job_id: str) -> bool:
        # A worker that claimed the job holds it (in_progress): only unheld jobs go.
        return self._read("delete_job", {"id": job_id}, "one") is not None


_STATES = {"pending": "waiting", "in_progress": "active", "done": "completed", "failed": "failed"}


def _record(row: tuple) -> JobRecord:
    (job_id, queue, job, status, delayed, attempt, key, payload, error,
     created_at, started_at, completed_at, available_at) = row
    state = "delayed" if status == "pending" and delayed else _STATES[status]
    return JobRecord(
        id=job_id, queue=queue, job=job, state=state, attempts=attempt, key=key,
        payload=payload if isinstance(payload, dict) else {}, error=error,
        enqueued_at=created_at.timestamp(), started_at=started_at.timestamp() if started_at else None,
        finished_at=completed_at.timestamp() if completed_at else None,
        eta=available_at.timestamp() if state == "delayed" else None,
    )
