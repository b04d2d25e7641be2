"""Nudges: at time T, send a task's follow-up -- unless the user already replied or the task closed.

:func:`schedule_nudge` records a ``nudges`` row and enqueues ``nudge.fire``
on the nudge queue, delayed until T. It is idempotent: the same key (by
default task + time + job) returns the nudge already set. When nudge.fire
runs, it locks the nudge by id and reads the task's current state: a reply
from the user after the nudge was set, or the task's closing, makes it
``skipped`` with that reason logged; otherwise it enqueues the nudge's job
(key ``nudge:{id}:send``) and marks it ``sent``, in one transaction, so a
second delivery of nudge.fire does nothing.

A user message in the platform's ``messages`` counts as a reply. The
platform's tasks have no closed state, so producers report closings with
:func:`note_task_closed` (and replies made elsewhere with
:func:`note_user_reply`), in table ``task_activity``.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from conveyor.errors import InvalidSchedule
from conveyor.platform.scheduling.followups import checked_follow_up
from conveyor.platform.scheduling.schedules import db_now
from conveyor.queries import load_queries
from conveyor.tasks.jobqueue import MAX_DELAY_SECONDS

if TYPE_CHECKING:
    from psycopg import Connection

    from conveyor.app import App

JOB = "nudge.fire"

QUERIES = load_queries(Path(__file__).with_name("nudges.sql"))


@dataclass(frozen=True)
class Nudge:
    """A nudge as set: ``created`` is False when the key named an existing one."""

    id: str
    job_id: str
    created: bool


@dataclass(frozen=True)
class NudgeRecord:
    """A ``nudges`` row: ``status`` is scheduled, sent (as ``sent_job_id``), skipped (for ``skip_reason``) or cancelled."""

    id: str
    task_id: str
    key: str
    fire_at: datetime
    job: str
    status: str
    skip_reason: str | None
    job_id: str | None
    sent_job_id: str | None
    created_at: datetime
    resolved_at: datetime | None


@dataclass(frozen=True)
class LockedNudge:
    """A nudge held for its firing's transaction, with what its task did since it was set."""

    task_id: str
    status: str
    fire_at: datetime
    job: str
    payload: dict[str, Any]
    task_closed: bool
    user_replied: bool


def nudge_key(nudge_id: str) -> str:
    return f"nudge:{nudge_id}"


def schedule_nudge(
    app: "App",
    *,
    task_id: str,
    at: datetime,
    job: str,
    payload: dict[str, Any],
    key: str | None = None,
    now: datetime | None = None,
) -> Nudge:
    """Nudge ``task_id`` at ``at`` by enqueueing ``job`` with ``payload`` then (validated now)."""
    if at.tzinfo is None:
        raise InvalidSchedule("a nudge's time must carry a time zone")
    checked = checked_follow_up(app, job, payload, "nudge")
    key = key or f"{task_id}:{at.isoformat()}:{job}"
    from psycopg.types.json import Jsonb  # not at import: see conveyor/queries.py

    with app.pool.connection() as conn:
        moment = db_now(conn, now)
        row = conn.execute(
            QUERIES["nudge_insert"],
            {
                "id": f"ndg_{uuid.uuid4().hex}",
                "task_id": task_id,
                "key": key,
                "fire_at": at,
                "job": job,
                "payload": Jsonb(checked),
            },
        ).fetchone()
        created = row is not None
        if not created:
            row = conn.execute(QUERIES["nudge_by_key"], {"key": key}).fetchone()
    assert row is not None  # inserted now, or there before under this key (nudges are never deleted)
    nudge_id: str = row[0]
    delay = min(max(0.0, (at - moment).total_seconds()), MAX_DELAY_SECONDS)
    # Enqueued again when the key existed: the job key makes that a no-op, or repairs a lost enqueue.
    ref = app.jobs.enqueue(JOB, {"nudge_id": nudge_id}, key=nudge_key(nudge_id), delay=delay)
    with app.pool.connection() as conn:
        conn.execute(QUERIES["nudge_set_job"], {"id": nudge_id, "job_id": ref.id})
    return Nudge(nudge_id, ref.id, created)


def cancel_nudge(conn: Connection[Any], nudge_id: str) -> bool:
    """Cancel a nudge not yet sent; its delayed job will skip. False when it had already been resolved."""
    return conn.execute(QUERIES["nudge_cancel"], {"id": nudge_id}).fetchone() is not None


def note_user_reply(conn: Connection[Any], task_id: str, at: datetime | None = None) -> None:
    """The user wrote in ``task_id`` (at ``at``, default now): nudges set before then will skip."""
    conn.execute(QUERIES["activity_reply"], {"task_id": task_id, "at": at})


def note_task_closed(conn: Connection[Any], task_id: str, at: datetime | None = None) -> None:
    """``task_id`` was closed: its nudges will skip."""
    conn.execute(QUERIES["activity_close"], {"task_id": task_id, "at": at})


def get_nudge(conn: Connection[Any], nudge_id: str) -> NudgeRecord | None:
    row = conn.execute(QUERIES["nudge_get"], {"id": nudge_id}).fetchone()
    return NudgeRecord(*row) if row else None


def lock_nudge(conn: Connection[Any], nudge_id: str) -> LockedNudge | None:
    """The nudge, locked until the transaction ends, and whether its task closed or its user replied since."""
    row = conn.execute(QUERIES["nudge_lock"], {"id": nudge_id}).fetchone()
    return LockedNudge(*row) if row else None


def mark_skipped(conn: Connection[Any], nudge_id: str, reason: str) -> None:
    """The nudge will not be sent, for ``reason`` (``user_replied`` or ``task_closed``)."""
    conn.execute(QUERIES["nudge_skipped"], {"id": nudge_id, "reason": reason})


def mark_sent(conn: Connection[Any], nudge_id: str, job_id: str) -> None:
    """The nudge's job was enqueued as ``job_id``."""
    conn.execute(QUERIES["nudge_sent"], {"id": nudge_id, "job_id": job_id})
