"""Firing the App's cron schedules: each occurrence enqueued once, however many schedulers run.

The schedules are those declared in code (``jobs.schedule``) and those managed at run time
(``app.cron``, ``conveyor cron``, ``/api/admin/cron``), read from their store at the start of
each pass (one query, one HGETALL): a schedule added, replaced, paused or removed counts from
the next pass of every scheduler. Paused ones are skipped; a stored one whose job or payload
no longer fits the App (a deploy removed the job, say) is skipped and logged.

A pass enqueues every occurrence of every schedule that fell in the last
``CONVEYOR_SCHEDULER_MISFIRE_GRACE`` seconds, with the key ``cron:<name>:<fire time>``.
The broker's keyed enqueue is atomic, so a second scheduler's (or a second pass's)
enqueue of an occurrence is a no-op: no table, no leader, no double fire, as long as
the grace is shorter than ``CONVEYOR_DEDUP_TTL`` (checked at start).

**Catch-up policy.** An occurrence is fired up to the grace late: passes run every
``CONVEYOR_SCHEDULER_INTERVAL`` seconds, so a scheduler restarted within the grace fires
what it missed. Occurrences that passed while no scheduler ran for longer than the grace
are skipped (not fired late); the schedule goes on with its next occurrence. A managed
schedule fires nothing from before it was stored or last resumed.

Time is the broker's server's (Postgres ``now()``, Redis ``TIME``; the inline broker's is
this process's), so schedulers on hosts whose clocks disagree never fire early.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from conveyor.appcache import per_app
from conveyor.errors import ConfigurationError, ConveyorError, InvalidSchedule
from conveyor.logs import log_event
from conveyor.scheduling.checks import check_grace, check_job
from conveyor.scheduling.cron import Cron
from conveyor.scheduling.store import StoredSchedule, schedule_store

if TYPE_CHECKING:
    import redis

    from conveyor.app import App

#: Occurrences of one schedule fired per pass at most (a schedule every second, a long grace).
MAX_PER_PASS = 1000


def fire_key(name: str, fire_time: datetime) -> str:
    """The enqueue key of one occurrence: the same for every scheduler that sees it."""
    return f"cron:{name}:{fire_time.astimezone(UTC).strftime('%Y-%m-%dT%H:%M:%SZ')}"


@dataclass(frozen=True)
class Fired:
    """One occurrence a pass enqueued (``deduplicated``: another scheduler or pass had)."""

    schedule: str
    fire_time: datetime
    job_id: str
    deduplicated: bool


@dataclass(frozen=True)
class _Active:
    """A schedule a pass fires: ``since``, when set, is the earliest occurrence it may fire."""

    name: str
    job: str
    payload: dict[str, Any]
    cron: Cron
    since: datetime | None = None


class _RedisClock:
    def __init__(self, client: redis.Redis) -> None:
        self.client = client

    def close(self) -> None:
        self.client.close()


@per_app
def _redis_clock(app: App) -> _RedisClock:
    from conveyor.redis_client import client

    assert app.settings.redis_url  # the redis backend is chosen by it
    return _RedisClock(client(app.settings.redis_url, app.settings))


def server_now(app: App) -> datetime:
    """Now by the clock of the server the broker keeps its data on."""
    store = app.capabilities.store
    if store == "postgres":
        from conveyor.db import wrap_errors

        with wrap_errors("reading the server's clock"), app.pool.connection() as conn:
            row = conn.execute("SELECT now()").fetchone()
        assert row is not None
        moment: datetime = row[0]
        return moment.astimezone(UTC)
    if store == "redis":
        from conveyor.redis_client import wrap_errors as redis_errors

        with redis_errors("reading the server's clock"):
            seconds, micros = _redis_clock(app).client.time()
        return datetime.fromtimestamp(seconds + micros / 1e6, UTC)
    return datetime.now(UTC)


class CronFirer:
    """Fires the App's schedules, code and managed. ``tick()`` is one pass; ``run()`` repeats it every interval."""

    def __init__(self, app: App) -> None:
        self.app = app
        if app.schedules:
            check_grace(app.settings)
        self._parsed: dict[tuple[str, str], Cron] = {}
        self.code = [_Active(n, s.job, s.payload, self._cron(s.cron, s.tz)) for n, s in app.schedules.items()]
        # Occurrences this firer has seen into the broker (enqueued, or found there): a later pass
        # in the grace window need not send them again. Lost with the process, which is harmless.
        self._sent: set[tuple[str, datetime]] = set()
        # Stored schedules skipped and logged already (once per process each, not every pass).
        self._skipped: set[tuple[str, str]] = set()

    def _cron(self, expression: str, tz: str) -> Cron:
        key = (expression, tz)
        if key not in self._parsed:
            self._parsed[key] = Cron.parse(expression, tz)
        return self._parsed[key]

    def schedules(self) -> list[_Active]:
        """The code schedules, then the stored ones that are not paused and still fit the App."""
        try:
            stored = schedule_store(self.app).list()
        except ConveyorError as exc:
            # The store away, or its table not migrated: the code schedules fire all the same.
            self._skip("*", f"the managed schedules could not be read: {exc}", once=False)
            return self.code
        if not stored:
            return self.code
        try:
            check_grace(self.app.settings)
        except ConfigurationError as exc:
            self._skip("*", str(exc))
            return self.code
        return self.code + [a for a in map(self._stored, stored) if a is not None]

    def _stored(self, s: StoredSchedule) -> _Active | None:
        if s.paused:
            return None
        if s.name in self.app.schedules:
            self._skip(s.name, "a schedule declared in code has its name; the code's fires")
            return None
        try:
            payload = check_job(self.app, s.job, s.payload)
            cron = self._cron(s.cron, s.tz)
        except InvalidSchedule as exc:
            self._skip(s.name, str(exc))
            return None
        return _Active(s.name, s.job, payload, cron, s.since)

    def _skip(self, name: str, why: str, *, once: bool = True) -> None:
        if once and (name, why) in self._skipped:
            return
        if once:
            self._skipped.add((name, why))
        log_event(
            "error",
            level="error",
            queue=None,
            job=None,
            job_id=None,
            attempt=None,
            error=f"cron schedule not fired: {why}",
            schedule=name,
        )

    def tick(self, now: datetime | None = None) -> list[Fired]:
        """Enqueue every occurrence due in the grace window before ``now`` (default: the server's clock)
        that this firer has not sent yet; return what it enqueued (or found a duplicate of)."""
        active = self.schedules()
        if not active:
            return []
        moment = now or server_now(self.app)
        window = moment - timedelta(seconds=self.app.settings.scheduler_misfire_grace)
        due = [
            (spec, fire_time)
            for spec in active
            for fire_time in spec.cron.between(max(window, spec.since or window), moment, MAX_PER_PASS)
            if (spec.name, fire_time) not in self._sent
        ]
        self._sent = {(name, t) for name, t in self._sent if t >= window}
        # Plain mappings (JobQueue takes them as JobRequests): this package sits below tasks/.
        requests = [{"job": spec.job, "payload": spec.payload, "key": fire_key(spec.name, t)} for spec, t in due]
        refs = self.app.jobs.enqueue_many(requests)
        fired = []
        for (spec, fire_time), ref in zip(due, refs):
            self._sent.add((spec.name, fire_time))
            fired.append(Fired(spec.name, fire_time, ref.id, ref.deduplicated))
            if not ref.deduplicated:
                log_event(
                    "schedule_fired",
                    queue=self.app.job_types[spec.job].queue,
                    job=spec.job,
                    job_id=ref.id,
                    attempt=None,
                    schedule=spec.name,
                    fire_time=fire_time.isoformat(),
                )
        return fired

    def run(self, stop: threading.Event) -> None:
        """Tick until ``stop`` is set. A failed pass is logged and the next one tries again."""
        interval = self.app.settings.scheduler_interval
        log_event("scheduler_started", queue=None, job=None, job_id=None, attempt=None, schedules=len(self.code))
        while not stop.is_set():
            try:
                self.tick()
            except Exception as exc:  # the broker away: nothing was enqueued that a later pass cannot
                log_event(
                    "error",
                    level="error",
                    queue=None,
                    job=None,
                    job_id=None,
                    attempt=None,
                    error=f"cron pass failed: {type(exc).__name__}: {exc}",
                )
            stop.wait(interval)
        log_event("scheduler_stopped", queue=None, job=None, job_id=None, attempt=None)
