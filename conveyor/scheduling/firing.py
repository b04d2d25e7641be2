"""Firing the App's code schedules: each occurrence enqueued once, however many schedulers run.

A pass enqueues every occurrence of every schedule that fell in the last
``CONVEYOR_SCHEDULER_MISFIRE_GRACE`` seconds, with the key ``cron:<name>:<fire time>``.
The broker's keyed enqueue is atomic, so a second scheduler's (or a second pass's)
enqueue of an occurrence is a no-op: no table, no leader, no double fire, as long as
the grace is shorter than ``CONVEYOR_DEDUP_TTL`` (checked at start).

**Catch-up policy.** An occurrence is fired up to the grace late: passes run every
``CONVEYOR_SCHEDULER_INTERVAL`` seconds, so a scheduler restarted within the grace fires
what it missed. Occurrences that passed while no scheduler ran for longer than the grace
are skipped (not fired late); the schedule goes on with its next occurrence.

Time is the broker's server's (Postgres ``now()``, Redis ``TIME``; the inline broker's is
this process's), so schedulers on hosts whose clocks disagree never fire early.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING

from conveyor.appcache import per_app
from conveyor.errors import ConfigurationError
from conveyor.logs import log_event
from conveyor.scheduling.cron import Cron

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
    """Fires the App's code schedules. ``tick()`` is one pass; ``run()`` repeats it every scheduler interval."""

    def __init__(self, app: App) -> None:
        self.app = app
        grace, ttl = app.settings.scheduler_misfire_grace, app.settings.dedup_ttl
        if app.schedules and grace >= min(ttl, app.settings.retention):
            # A key holds only while its job's record is kept (Redis frees a key whose record is gone).
            raise ConfigurationError(
                "CONVEYOR_SCHEDULER_MISFIRE_GRACE must be shorter than CONVEYOR_DEDUP_TTL and "
                "CONVEYOR_RETENTION: an occurrence's key must outlive the time it may still be fired"
            )
        self.crons = {name: Cron.parse(s.cron, s.tz) for name, s in app.schedules.items()}
        # Occurrences this firer has seen into the broker (enqueued, or found there): a later pass
        # in the grace window need not send them again. Lost with the process, which is harmless.
        self._sent: set[tuple[str, datetime]] = set()

    def tick(self, now: datetime | None = None) -> list[Fired]:
        """Enqueue every occurrence due in the grace window before ``now`` (default: the server's clock)
        that this firer has not sent yet; return what it enqueued (or found a duplicate of)."""
        if not self.crons:
            return []
        moment = now or server_now(self.app)
        since = moment - timedelta(seconds=self.app.settings.scheduler_misfire_grace)
        due = [
            (name, fire_time)
            for name, cron in self.crons.items()
            for fire_time in cron.between(since, moment, MAX_PER_PASS)
            if (name, fire_time) not in self._sent
        ]
        self._sent = {(name, t) for name, t in self._sent if t >= since}
        schedules = self.app.schedules
        # Plain mappings (JobQueue takes them as JobRequests): this package sits below tasks/.
        requests = [
            {"job": schedules[name].job, "payload": schedules[name].payload, "key": fire_key(name, t)}
            for name, t in due
        ]
        refs = self.app.jobs.enqueue_many(requests)
        fired = []
        for (name, fire_time), ref in zip(due, refs):
            self._sent.add((name, fire_time))
            fired.append(Fired(name, fire_time, ref.id, ref.deduplicated))
            if not ref.deduplicated:
                spec = schedules[name]
                log_event(
                    "schedule_fired",
                    queue=self.app.job_types[spec.job].queue,
                    job=spec.job,
                    job_id=ref.id,
                    attempt=None,
                    schedule=name,
                    fire_time=fire_time.isoformat(),
                )
        return fired

    def run(self, stop: threading.Event) -> None:
        """Tick until ``stop`` is set. A failed pass is logged and the next one tries again."""
        interval = self.app.settings.scheduler_interval
        log_event("scheduler_started", queue=None, job=None, job_id=None, attempt=None, schedules=len(self.crons))
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
