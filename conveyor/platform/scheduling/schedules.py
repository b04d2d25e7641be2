"""Schedules in Postgres: create (validated), list, pause, resume, delete.

A schedule names a job and its payload, a cron expression and a zone, and a
misfire policy (see :mod:`conveyor.platform.scheduling.scheduler`). Everything is
checked at creation -- cron, zone, policy, job, payload -- so a schedule that
exists can fire. The payload is stored as plain JSON, so jobs with secret
fields cannot be scheduled.
"""

from __future__ import annotations

import uuid
from dataclasses import asdict, dataclass
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import psycopg
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb

from conveyor.db import load_queries
from conveyor.errors import EnqueueError, InvalidSchedule, ScheduleNotFound, UnknownJob
from conveyor.platform.scheduling.cron import Cron
from conveyor.tasks.jobqueue import validate_payload

if TYPE_CHECKING:
    from conveyor.app import App

QUERIES = load_queries(Path(__file__).with_name("queries.sql"))

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


def new_schedule_id() -> str:
    return f"sch_{uuid.uuid4().hex}"


class Schedules:
    """The schedules of one App's database. Methods take ``now`` so tests move the clock."""

    def __init__(self, app: "App") -> None:
        self.app = app

    def create(
        self,
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
        """Validate everything, then store the schedule; its first fire is the first occurrence after ``now``."""
        parsed = Cron.parse(cron, timezone)
        if misfire_policy not in MISFIRE_POLICIES:
            raise InvalidSchedule(
                f"unknown misfire policy {misfire_policy!r}; use one of {', '.join(MISFIRE_POLICIES)}"
            )
        if name is not None and (not name.strip() or name.startswith("sch_") or len(name) > 200):
            raise InvalidSchedule("a schedule name is 1-200 characters and does not start with 'sch_'")
        job_type = self.app.job_types.get(job)
        if job_type is None:
            raise InvalidSchedule(str(UnknownJob(job, list(self.app.job_types))))
        if job_type.payload.secret_fields:
            raise InvalidSchedule(
                f"job {job!r} has secret fields ({', '.join(sorted(job_type.payload.secret_fields))}); "
                "schedules store payloads in plain JSON and cannot hold secrets"
            )
        try:
            checked = validate_payload(job, job_type.payload, payload or {})
        except EnqueueError as exc:
            raise InvalidSchedule(str(exc)) from None
        with self.app.pool.connection() as conn:
            moment = db_now(conn, now)
            params = {
                "id": new_schedule_id(),
                "name": name,
                "cron": parsed.expression,
                "timezone": timezone,
                "job": job,
                "payload": Jsonb(checked.model_dump(mode="json")),
                "misfire_policy": misfire_policy,
                "enabled": enabled,
                "next_fire_at": parsed.next_after(moment),
            }
            try:
                row = conn.cursor(row_factory=dict_row).execute(QUERIES["schedule_insert"], params).fetchone()
            except psycopg.errors.UniqueViolation:
                raise InvalidSchedule(f"a schedule named {name!r} already exists") from None
        return Schedule(**row)

    def get(self, schedule_id: str) -> Schedule:
        """The schedule with this id or name; ScheduleNotFound otherwise."""
        found = self.find(schedule_id)
        if found is None:
            raise ScheduleNotFound(f"no schedule {schedule_id!r}")
        return found

    def find(self, schedule_id: str) -> Schedule | None:
        return self._one("schedule_get", {"id": schedule_id})

    def list(self, *, limit: int = 100, offset: int = 0) -> list[Schedule]:
        with self.app.pool.connection() as conn:
            rows = (
                conn.cursor(row_factory=dict_row)
                .execute(QUERIES["schedule_list"], {"limit": limit, "offset": offset})
                .fetchall()
            )
        return [Schedule(**r) for r in rows]

    def pause(self, schedule_id: str) -> Schedule:
        """Stop firing. A fire already enqueued is skipped by schedule.fire, which checks ``enabled``."""
        return self._required("schedule_pause", {"id": schedule_id})

    def resume(self, schedule_id: str, *, now: datetime | None = None) -> Schedule:
        """Fire again from the first occurrence after ``now``; occurrences while paused are not caught up."""
        schedule = self.get(schedule_id)
        cron = Cron.parse(schedule.cron, schedule.timezone)
        with self.app.pool.connection() as conn:
            moment = db_now(conn, now)
        return self._required("schedule_resume", {"id": schedule.id, "next_fire_at": cron.next_after(moment)})

    def delete(self, schedule_id: str) -> None:
        """Delete the schedule and its fire history. A fire already enqueued finds no schedule and is skipped."""
        with self.app.pool.connection() as conn:
            if conn.execute(QUERIES["schedule_delete"], {"id": schedule_id}).fetchone() is None:
                raise ScheduleNotFound(f"no schedule {schedule_id!r}")

    def fires(self, schedule_id: str) -> list[dict[str, Any]]:
        """What schedule.fire did with each occurrence: fire_time, status, job_id, reason, fired_at."""
        with self.app.pool.connection() as conn:
            return conn.cursor(row_factory=dict_row).execute(QUERIES["fire_list"], {"id": schedule_id}).fetchall()

    def record_fire(
        self,
        schedule_id: str,
        fire_time: datetime,
        *,
        status: str,
        job_id: str | None = None,
        reason: str | None = None,
    ) -> None:
        """Note what became of one occurrence (the first note wins: schedule.fire may run twice)."""
        with self.app.pool.connection() as conn:
            try:
                conn.execute(
                    QUERIES["fire_record"],
                    {"id": schedule_id, "fire_time": fire_time, "status": status, "job_id": job_id, "reason": reason},
                )
            except psycopg.errors.ForeignKeyViolation:
                pass  # deleted meanwhile: its history went with it

    def _one(self, query: str, params: dict) -> Schedule | None:
        with self.app.pool.connection() as conn:
            row = conn.cursor(row_factory=dict_row).execute(QUERIES[query], params).fetchone()
        return Schedule(**row) if row else None

    def _required(self, query: str, params: dict) -> Schedule:
        found = self._one(query, params)
        if found is None:
            raise ScheduleNotFound(f"no schedule {params['id']!r}")
        return found


def db_now(conn, now: datetime | None) -> datetime:
    """``now`` if given, else the database's clock: every scheduler then agrees on the time."""
    return conn.execute(QUERIES["db_now"], {"now": now}).fetchone()[0]
