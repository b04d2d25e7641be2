"""wait_and_resume: a run paused by a tool resumes after a delay, unless it is cancelled first.

:func:`pause_run` records a ``run_pauses`` row (at most one waiting pause per
run) and enqueues ``wait_and_resume`` on the scheduling queue, delayed until
the resume time. When it runs, the processor locks the row by its id: if
the pause is still ``waiting`` it enqueues the run's resume job (key
``resume:{pause_id}:run``) and marks it ``resumed``, in one transaction;
if the run was cancelled meanwhile (:func:`cancel_run`) it skips, with the
reason logged; likewise when the platform's ``runs`` row says the run was
cancelled or ended by another path. Cancelling therefore needs no access to
the broker's delayed queue: the delayed job stays, and does nothing when it
comes due.

Delays longer than the broker's delay window (7 days) work too: the job
wakes at the window's end and re-defers itself without spending an attempt.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

from conveyor.errors import InvalidSchedule, ScheduleError
from conveyor.platform.scheduling.followups import checked_follow_up
from conveyor.platform.scheduling.schedules import db_now
from conveyor.queries import load_queries
from conveyor.tasks.jobqueue import MAX_DELAY_SECONDS

if TYPE_CHECKING:
    from psycopg import Connection

    from conveyor.app import App

JOB = "wait_and_resume"

QUERIES = load_queries(Path(__file__).with_name("pauses.sql"))


@dataclass(frozen=True)
class Pause:
    """A recorded pause: resume job ``job_id`` comes due at ``resume_at``."""

    id: str
    run_id: str
    resume_at: datetime
    job_id: str


@dataclass(frozen=True)
class PauseRecord:
    """A ``run_pauses`` row: ``status`` is waiting, resumed (as ``resumed_job_id``) or cancelled."""

    id: str
    run_id: str
    task_id: str | None
    status: str
    reason: str
    resume_at: datetime
    resume_job: str
    job_id: str | None
    resumed_job_id: str | None
    created_at: datetime
    resolved_at: datetime | None


@dataclass(frozen=True)
class LockedPause:
    """A pause held for its resumption's transaction, with its run's status when the run is the platform's."""

    run_id: str
    status: str
    resume_job: str
    resume_payload: dict[str, Any]
    resume_at: datetime
    run_status: str | None


def resume_key(pause_id: str) -> str:
    return f"resume:{pause_id}"


def pause_run(
    app: "App",
    *,
    run_id: str,
    resume_job: str,
    resume_payload: dict[str, Any],
    delay: float,
    task_id: str | None = None,
    reason: str = "",
    now: datetime | None = None,
) -> Pause:
    """Pause ``run_id`` for ``delay`` seconds; then enqueue ``resume_job`` with ``resume_payload``.

    The resume job and payload are validated now, so a pause that exists can resume.
    Raises ScheduleError if the run already has a waiting pause.
    """
    if delay < 0:
        raise InvalidSchedule("a pause's delay cannot be negative")
    checked = checked_follow_up(app, resume_job, resume_payload, "resume")
    pause_id = f"pse_{uuid.uuid4().hex}"
    import psycopg  # not at import: see conveyor/queries.py
    from psycopg.types.json import Jsonb

    with app.pool.connection() as conn:
        resume_at = db_now(conn, now) + timedelta(seconds=delay)
        try:
            conn.execute(
                QUERIES["pause_insert"],
                {
                    "id": pause_id,
                    "run_id": run_id,
                    "task_id": task_id,
                    "reason": reason,
                    "resume_at": resume_at,
                    "resume_job": resume_job,
                    "resume_payload": Jsonb(checked),
                },
            )
        except psycopg.errors.UniqueViolation:
            raise ScheduleError(f"run {run_id} is already paused") from None
    ref = app.jobs.enqueue(JOB, {"pause_id": pause_id}, key=resume_key(pause_id), delay=min(delay, MAX_DELAY_SECONDS))
    with app.pool.connection() as conn:
        conn.execute(QUERIES["pause_set_job"], {"id": pause_id, "job_id": ref.id})
    return Pause(pause_id, run_id, resume_at, ref.id)


def cancel_run(conn: Connection[Any], run_id: str) -> list[str]:
    """Cancel the run's waiting resume (its delayed job will skip); return the cancelled pause ids."""
    return [row[0] for row in conn.execute(QUERIES["pause_cancel_run"], {"run_id": run_id})]


def get_pause(conn: Connection[Any], pause_id: str) -> PauseRecord | None:
    row = conn.execute(QUERIES["pause_get"], {"id": pause_id}).fetchone()
    return PauseRecord(*row) if row else None


def lock_pause(conn: Connection[Any], pause_id: str) -> LockedPause | None:
    """The pause, locked until the transaction ends (this orders a resumption against :func:`cancel_run`)."""
    row = conn.execute(QUERIES["pause_lock"], {"id": pause_id}).fetchone()
    return LockedPause(*row) if row else None


def mark_cancelled(conn: Connection[Any], pause_id: str) -> None:
    """The pause will not resume: its run ended by another path."""
    conn.execute(QUERIES["pause_cancel"], {"id": pause_id})


def mark_resumed(conn: Connection[Any], pause_id: str, job_id: str) -> None:
    """The pause's resume job ``job_id`` was enqueued."""
    conn.execute(QUERIES["pause_resumed"], {"id": pause_id, "job_id": job_id})
