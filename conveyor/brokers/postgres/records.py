"""Job records from the jobs table's rows, as the dashboard and the API see them (``base.JobRecord``).

Payloads are passed through as stored and never printed.
"""

from __future__ import annotations

from typing import Any

from conveyor.brokers.base import JobRecord

#: state -> (query in jobs.sql, status parameter)
LISTS = {
    "waiting": ("list_waiting", None),
    "delayed": ("list_delayed", None),
    "awaiting": ("list_awaiting", None),
    "active": ("list_active", None),
    "completed": ("list_finished", "done"),
    "failed": ("list_finished", "failed"),
    "cancelled": ("list_finished", "cancelled"),
}

_STATES = {
    "pending": "waiting",
    "in_progress": "active",
    "done": "completed",
    "failed": "failed",
    "cancelled": "cancelled",
}


def job_record(row: tuple[Any, ...]) -> JobRecord:
    """One row of ``get_job`` / ``list_*`` as a record."""
    (
        job_id,
        queue,
        job,
        status,
        delayed,
        attempt,
        key,
        payload,
        error,
        created_at,
        started_at,
        completed_at,
        available_at,
        wait_event,
        priority,
        group,
    ) = row
    state = "delayed" if status == "pending" and delayed else _STATES[status]
    awaiting = state == "delayed" and wait_event is not None
    state = "awaiting" if awaiting else state
    return JobRecord(
        id=job_id,
        queue=queue,
        job=job,
        state=state,
        attempts=attempt,
        key=key,
        payload=payload if isinstance(payload, dict) else {},
        error=error,
        enqueued_at=created_at.timestamp(),
        started_at=started_at.timestamp() if started_at else None,
        finished_at=completed_at.timestamp() if completed_at else None,
        eta=available_at.timestamp() if state in ("delayed", "awaiting") else None,
        event=wait_event if awaiting else None,
        priority=priority,
        group=group,
    )
