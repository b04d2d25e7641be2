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
from typing import TYPE_CHECKING, Any

from psycopg.rows import dict_row
from psycopg.types.json import Jsonb

from conveyor.errors import InvalidSchedule
from conveyor.platform.scheduling.followups import checked_follow_up
from conveyor.platform.scheduling.schedules import QUERIES, db_now
from conveyor.tasks.jobqueue import MAX_DELAY_SECONDS

if TYPE_CHECKING:
    from conveyor.app import App

JOB = "nudge.fire"


@dataclass(frozen=True)
class Nudge:
    """A nudge as set: ``created`` is False when the key named an existing one."""

    id: str
    job_id: str
    created: bool


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
    # None only if the keyed nudge was deleted between the insert's conflict and this read.
    assert row is not None
    nudge_id = row[0]
    delay = min(max(0.0, (at - moment).total_seconds()), MAX_DELAY_SECONDS)
    # Enqueued again when the key existed: the job key makes that a no-op, or repairs a lost enqueue.
    ref = app.jobs.enqueue(JOB, {"nudge_id": nudge_id}, key=nudge_key(nudge_id), delay=delay)
    with app.pool.connection() as conn:
        conn.execute(QUERIES["nudge_set_job"], {"id": nudge_id, "job_id": ref.id})
    return Nudge(nudge_id, ref.id, created)


def cancel_nudge(app: "App", nudge_id: str) -> bool:
    """Cancel a nudge not yet sent; its delayed job will skip. False when it had already been resolved."""
    with app.pool.connection() as conn:
        return conn.execute(QUERIES["nudge_cancel"], {"id": nudge_id}).fetchone() is not None


def note_user_reply(app: "App", task_id: str, at: datetime | None = None) -> None:
    """The user wrote in ``task_id`` (at ``at``, default now): nudges set before then will skip."""
    with app.pool.connection() as conn:
        conn.execute(QUERIES["activity_reply"], {"task_id": task_id, "at": at})


def note_task_closed(app: "App", task_id: str, at: datetime | None = None) -> None:
    """``task_id`` was closed: its nudges will skip."""
    with app.pool.connection() as conn:
        conn.execute(QUERIES["activity_close"], {"task_id": task_id, "at": at})


def get_nudge(app: "App", nudge_id: str) -> dict[str, Any] | None:
    with app.pool.connection() as conn:
        return conn.cursor(row_factory=dict_row).execute(QUERIES["nudge_get"], {"id": nudge_id}).fetchone()
