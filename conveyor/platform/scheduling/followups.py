"""What pauses and nudges share: a follow-up job checked when set, and enqueued when due."""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING, Any

from conveyor.errors import EnqueueError, InvalidPayload, InvalidSchedule, PermanentError, RetryLater, UnknownJob
from conveyor.platform.scheduling.schedules import db_now
from conveyor.tasks.jobqueue import MAX_DELAY_SECONDS, validate_payload

if TYPE_CHECKING:
    from psycopg import Connection

    from conveyor.app import App
    from conveyor.brokers.base import JobRef

#: A job delivered up to this many seconds before its time runs anyway (clocks of hosts differ a little).
EARLY_TOLERANCE = 1.0


def checked_follow_up(app: "App", job: str, payload: dict[str, Any], what: str) -> dict[str, Any]:
    """The follow-up's payload, validated now so that a pause or nudge that exists can act; else InvalidSchedule."""
    job_type = app.job_types.get(job)
    if job_type is None:
        raise InvalidSchedule(f"unknown {what} job {job!r}")
    try:
        return validate_payload(job, job_type.payload, payload).model_dump(mode="json")
    except EnqueueError as exc:
        raise InvalidSchedule(str(exc)) from None


def defer_if_early(conn: Connection[Any], due_at: datetime, what: str) -> None:
    """RetryLater (no attempt spent) when ``due_at`` is still ahead: delays past the broker's window hop."""
    early = (due_at - db_now(conn, None)).total_seconds()
    if early > EARLY_TOLERANCE:
        raise RetryLater(f"{what} is due at {due_at.isoformat()}", delay=min(early, MAX_DELAY_SECONDS))


def enqueue_follow_up(app: "App", job: str, payload: dict[str, Any], key: str, what: str) -> "JobRef":
    """Enqueue the follow-up under ``key``; a job or payload that no longer validates fails for good."""
    try:
        return app.jobs.enqueue(job, payload, key=key)
    except (UnknownJob, InvalidPayload) as exc:
        raise PermanentError(f"cannot {what}: {exc}") from None
