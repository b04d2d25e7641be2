"""Schedules in Postgres: create (validated), list, pause, resume, delete, and their fire history.

A schedule names a job and its payload, a cron expression and a zone, and a
misfire policy (see :mod:`conveyor.platform.scheduling.scheduler`). Everything is
checked at creation -- cron, zone, policy, job, payload -- so a schedule that
exists can fire. The payload is stored as plain JSON, so jobs with secret
fields cannot be scheduled.

Plain functions over a connection, returning frozen dataclasses, like
:mod:`conveyor.platform.records`; the SQL is in ``schedules.sql``. Functions
take ``now`` so tests move the clock.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from conveyor.errors import EnqueueError, InvalidSchedule, ScheduleNotFound, UnknownJob
from conveyor.queries import load_queries
from conveyor.scheduling.cron import Cron
from conveyor.tasks.jobqueue import validate_payload

if TYPE_CHECKING:
    from psycopg import Connection

    from conveyor.blueprints import JobType

QUERIES = load_queries(Path(__file__).with_name("schedules.sql"))

#: What a scheduler does with occurrences missed while no scheduler ran (see scheduler.py).
MISFIRE_POLICIES = ("once", "skip", "all")


@dataclass(frozen=True)
class Schedule:
    """One schedule row."""

    id: str
    name: str | None
    cron: str
    timezone: str
    job: str
    payload: dict[str, Any]
    misfire_policy: str
    enabled: bool
    next_fire_at: datetime
    last_fire_at: datetime | None
    created_at: datetime
    updated_at: datetime

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class FireRecord:
    """What schedule.fire did with one occurrence: ``enqueued`` (as ``job_id``) or ``skipped`` (for ``reason``)."""

    fire_time: datetime
    status: str
    job_id: str | None
    reason: str | None
    fired_at: datetime

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def new_schedule_id() -> str:
    return f"sch_{uuid.uuid4().hex}"


def create_schedule(
    conn: Connection[Any],
    job_types: Mapping[str, JobType],
    *,
    cron: str,
    job: str,
    payload: dict[str, Any] | None = None,
    timezone: str = "UTC",
    name: str | None = None,
    misfire_policy: str = "once",
    enabled: bool = True,
    now: datetime | None = None,
) -> Schedule:
    """Validate everything against ``job_types``, then store the schedule.

    Its first fire is the first occurrence after ``now``.
    """
    parsed = Cron.parse(cron, timezone)
    if misfire_policy not in MISFIRE_POLICIES:
        raise InvalidSchedule(f"unknown misfire policy {misfire_policy!r}; use one of {', '.join(MISFIRE_POLICIES)}")
    if name is not None and (not name.strip() or name.startswith("sch_") or len(name) > 200):
        raise InvalidSchedule("a schedule name is 1-200 characters and does not start with 'sch_'")
    job_type = job_types.get(job)
    if job_type is None:
        raise InvalidSchedule(str(UnknownJob(job, list(job_types))))
    if job_type.payload.secret_fields:
        raise InvalidSchedule(
            f"job {job!r} has secret fields ({', '.join(sorted(job_type.payload.secret_fields))}); "
            "schedules store payloads in plain JSON and cannot hold secrets"
        )
    try:
        checked = validate_payload(job, job_type.payload, payload or {})
    except EnqueueError as exc:
        raise InvalidSchedule(str(exc)) from None
    import psycopg  # not at import: see conveyor/queries.py
    from psycopg.types.json import Jsonb

    params = {
        "id": new_schedule_id(),
        "name": name,
        "cron": parsed.expression,
        "timezone": timezone,
        "job": job,
        "payload": Jsonb(checked.model_dump(mode="json")),
        "misfire_policy": misfire_policy,
        "enabled": enabled,
        "next_fire_at": parsed.next_after(db_now(conn, now)),
    }
    try:
        row = conn.execute(QUERIES["schedule_insert"], params).fetchone()
    except psycopg.errors.UniqueViolation:
        raise InvalidSchedule(f"a schedule named {name!r} already exists") from None
    assert row is not None  # RETURNING of an insert that did not conflict
    return Schedule(*row)


def find_schedule(conn: Connection[Any], schedule_id: str) -> Schedule | None:
    """The schedule with this id or name, or None."""
    row = conn.execute(QUERIES["schedule_get"], {"id": schedule_id}).fetchone()
    return Schedule(*row) if row else None


def get_schedule(conn: Connection[Any], schedule_id: str) -> Schedule:
    """The schedule with this id or name; :class:`ScheduleNotFound` otherwise."""
    found = find_schedule(conn, schedule_id)
    if found is None:
        raise ScheduleNotFound(f"no schedule {schedule_id!r}")
    return found


def list_schedules(conn: Connection[Any], *, limit: int = 100, offset: int = 0) -> list[Schedule]:
    """Schedules oldest first."""
    return [Schedule(*row) for row in conn.execute(QUERIES["schedule_list"], {"limit": limit, "offset": offset})]


def pause_schedule(conn: Connection[Any], schedule_id: str) -> Schedule:
    """Stop firing. A fire already enqueued is skipped by schedule.fire, which checks ``enabled``."""
    return _required(conn, "schedule_pause", {"id": schedule_id})


def resume_schedule(conn: Connection[Any], schedule_id: str, *, now: datetime | None = None) -> Schedule:
    """Fire again from the first occurrence after ``now``; occurrences while paused are not caught up."""
    schedule = get_schedule(conn, schedule_id)
    cron = Cron.parse(schedule.cron, schedule.timezone)
    return _required(conn, "schedule_resume", {"id": schedule.id, "next_fire_at": cron.next_after(db_now(conn, now))})


def delete_schedule(conn: Connection[Any], schedule_id: str) -> None:
    """Delete the schedule and its fire history. A fire already enqueued finds no schedule and is skipped."""
    if conn.execute(QUERIES["schedule_delete"], {"id": schedule_id}).fetchone() is None:
        raise ScheduleNotFound(f"no schedule {schedule_id!r}")


def fires(conn: Connection[Any], schedule_id: str) -> list[FireRecord]:
    """What schedule.fire did with each occurrence, oldest first."""
    return [FireRecord(*row) for row in conn.execute(QUERIES["fire_list"], {"id": schedule_id})]


def record_fire(
    conn: Connection[Any],
    schedule_id: str,
    fire_time: datetime,
    *,
    status: str,
    job_id: str | None = None,
    reason: str | None = None,
) -> None:
    """Note what became of one occurrence (the first note wins: schedule.fire may run twice)."""
    import psycopg  # not at import: see conveyor/queries.py

    try:
        conn.execute(
            QUERIES["fire_record"],
            {"id": schedule_id, "fire_time": fire_time, "status": status, "job_id": job_id, "reason": reason},
        )
    except psycopg.errors.ForeignKeyViolation:
        pass  # deleted meanwhile: its history went with it


def db_now(conn: Connection[Any], now: datetime | None) -> datetime:
    """``now`` if given, else the database's clock: every scheduler then agrees on the time."""
    row = conn.execute(QUERIES["db_now"], {"now": now}).fetchone()
    assert row is not None  # a SELECT without FROM has one row
    moment: datetime = row[0]
    return moment


def _required(conn: Connection[Any], query: str, params: dict[str, Any]) -> Schedule:
    row = conn.execute(QUERIES[query], params).fetchone()
    if row is None:
        raise ScheduleNotFound(f"no schedule {params['id']!r}")
    return Schedule(*row)
