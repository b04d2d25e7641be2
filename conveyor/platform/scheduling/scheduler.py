"""The scheduler: fires due schedules by enqueueing ``schedule.fire``. Run as many as you like.

Each pass claims due rows with ``FOR UPDATE SKIP LOCKED``, enqueues one
``schedule.fire`` per occurrence with the key ``schedule:{id}:{fire time}``
and moves ``next_fire_at`` on, in one transaction. Two schedulers never hold
the same row at once, and if one dies between its enqueue and its commit
the next pass enqueues the same key again, which the JobQueue deduplicates:
every occurrence fires once, however many schedulers run.

Time is the database's clock (``now()``), so schedulers on hosts with
skewed clocks agree; tests pass ``now`` instead.

**Missed fires.** After downtime (no scheduler running, or a schedule's
occurrences came due faster than passes ran), each schedule's
``misfire_policy`` decides:

- ``once`` (the default): fire one catch-up, for the latest missed
  occurrence, not one per missed slot; then continue from now.
- ``skip``: fire the latest occurrence only if it is at most
  ``CONVEYOR_SCHEDULER_MISFIRE_GRACE`` seconds late; otherwise fire nothing
  and continue from now.
- ``all``: fire every missed occurrence, oldest first (at most
  :data:`MAX_CATCHUP` per schedule per batch; the rest follow at once).

Missed occurrences are logged as ``schedule_missed`` with their count.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from conveyor.errors import InvalidSchedule
from conveyor.logs import log_event
from conveyor.platform.rounds import requeue_stranded_runs
from conveyor.platform.scheduling.schedules import db_now, pause_schedule
from conveyor.queries import load_queries
from conveyor.scheduling.cron import Cron
from conveyor.tasks.jobqueue import JobRequest

if TYPE_CHECKING:
    from psycopg import Connection

    from conveyor.app import App

#: Due schedules claimed per transaction; a pass repeats until none are due.
BATCH = 100

#: Policy ``all`` fires at most this many missed occurrences of one schedule per batch.
MAX_CATCHUP = 100

#: Missed occurrences are counted for the log up to this many.
MISSED_COUNT_LIMIT = 10_000

JOB = "schedule.fire"

QUERIES = load_queries(Path(__file__).with_name("scheduler.sql"))


def fire_key(schedule_id: str, fire_time: datetime) -> str:
    """The enqueue key of one occurrence: the same for every scheduler that sees it."""
    return f"schedule:{schedule_id}:{fire_time.astimezone(UTC).strftime('%Y-%m-%dT%H:%M:%SZ')}"


@dataclass(frozen=True)
class Fire:
    """One schedule.fire enqueued by a pass (``deduplicated``: another scheduler had enqueued it)."""

    schedule_id: str
    fire_time: datetime
    job_id: str
    deduplicated: bool


@dataclass(frozen=True)
class _Plan:
    schedule_id: str
    fire_times: list[datetime]
    next_fire_at: datetime
    missed: int
    policy: str


class Scheduler:
    """Fires due schedules. ``tick()`` is one pass; ``run()`` repeats it every ``CONVEYOR_SCHEDULER_INTERVAL``."""

    def __init__(self, app: "App") -> None:
        self.app = app

    def tick(self, now: datetime | None = None) -> list[Fire]:
        """Fire everything due at ``now`` (default: the database's clock); return what was enqueued."""
        fired: list[Fire] = []
        while True:
            batch, more = self._batch(now)
            fired.extend(batch)
            if not more:
                return fired

    def run(self, stop: threading.Event) -> None:
        """Tick until ``stop`` is set. A failed pass is logged and retried on the next tick."""
        interval = self.app.settings.scheduler_interval
        log_event("scheduler_started", queue="scheduling", job=JOB, job_id=None, attempt=None, interval_s=interval)
        while not stop.is_set():
            try:
                self.tick()
                stranded = requeue_stranded_runs(self.app)
                if stranded:
                    log_event(
                        "stranded_runs_enqueued",
                        level="warning",
                        queue=None,
                        job=None,
                        job_id=None,
                        attempt=None,
                        count=stranded,
                    )
            except Exception as exc:  # Postgres or the broker away: nothing was committed, try again
                log_event(
                    "error",
                    level="error",
                    queue="scheduling",
                    job=JOB,
                    job_id=None,
                    attempt=None,
                    error=f"scheduler pass failed: {type(exc).__name__}: {exc}",
                )
            stop.wait(interval)
        log_event("scheduler_stopped", queue="scheduling", job=JOB, job_id=None, attempt=None)

    def _batch(self, now: datetime | None) -> tuple[list[Fire], bool]:
        grace = self.app.settings.scheduler_misfire_grace
        with self.app.pool.connection() as conn, conn.transaction():
            moment = db_now(conn, now)
            due = _claim_due(conn, moment)
            plans = []
            for d in due:
                try:
                    plans.append(_plan(d.id, Cron.parse(d.cron, d.timezone), d.policy, d.next_fire_at, moment, grace))
                except InvalidSchedule as exc:
                    # The zone database changed under it: stop it rather than fail every pass.
                    pause_schedule(conn, d.id)
                    log_event(
                        "error",
                        level="error",
                        queue="scheduling",
                        job=JOB,
                        job_id=None,
                        attempt=None,
                        schedule_id=d.id,
                        error=f"schedule paused: {exc}",
                    )
            requests = [
                JobRequest(JOB, {"schedule_id": p.schedule_id, "fire_time": t.isoformat()}, fire_key(p.schedule_id, t))
                for p in plans
                for t in p.fire_times
            ]
            refs = iter(self.app.jobs.enqueue_many(requests))
            fired: list[Fire] = []
            for plan in plans:
                for fire_time in plan.fire_times:
                    ref = next(refs)
                    fired.append(Fire(plan.schedule_id, fire_time, ref.id, ref.deduplicated))
                    log_event(
                        "schedule_fired",
                        queue="scheduling",
                        job=JOB,
                        job_id=ref.id,
                        attempt=None,
                        schedule_id=plan.schedule_id,
                        fire_time=fire_time.isoformat(),
                        deduplicated=ref.deduplicated,
                    )
                if plan.missed:
                    log_event(
                        "schedule_missed",
                        level="warning",
                        queue="scheduling",
                        job=JOB,
                        job_id=None,
                        attempt=None,
                        schedule_id=plan.schedule_id,
                        missed=plan.missed,
                        policy=plan.policy,
                    )
                _advance(conn, plan)
        return fired, len(due) == BATCH


@dataclass(frozen=True)
class _Due:
    id: str
    cron: str
    timezone: str
    policy: str
    next_fire_at: datetime


def _claim_due(conn: Connection[Any], now: datetime) -> list[_Due]:
    """Lock up to :data:`BATCH` due schedules for this transaction, skipping those another scheduler holds."""
    return [_Due(*row) for row in conn.execute(QUERIES["schedule_claim_due"], {"now": now, "limit": BATCH})]


def _advance(conn: Connection[Any], plan: _Plan) -> None:
    """Move a schedule on past what this pass fired."""
    conn.execute(
        QUERIES["schedule_advance"],
        {
            "id": plan.schedule_id,
            "next_fire_at": plan.next_fire_at,
            "last_fire_at": plan.fire_times[-1] if plan.fire_times else None,
        },
    )


def _plan(schedule_id: str, cron: Cron, policy: str, next_fire_at: datetime, now: datetime, grace: float) -> _Plan:
    """Which occurrences of a due schedule to fire now, and when it is due next."""
    if policy == "all":
        fires = cron.between(next_fire_at, now, MAX_CATCHUP)
        following = cron.next_after(fires[-1]) if fires else cron.next_after(now)
        return _Plan(schedule_id, fires, following, 0, policy)
    latest = max(cron.latest_at_or_before(now) or next_fire_at, next_fire_at)
    due = len(cron.between(next_fire_at, latest, MISSED_COUNT_LIMIT)) or 1
    if policy == "skip" and (now - latest).total_seconds() > grace:
        return _Plan(schedule_id, [], cron.next_after(now), due, policy)
    return _Plan(schedule_id, [latest], cron.next_after(now), due - 1, policy)
