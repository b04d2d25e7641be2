"""``app.cron``: cron schedules managed at run time, beside those declared in code.

``app.cron.add("nightly-report", cron="0 3 * * *", job="reports.build", payload={...}, tz="Europe/Berlin")``
stores a schedule (or replaces the one of that name) in the store beside the broker; every
``conveyor scheduler`` and every worker that fires schedules picks it up at its next pass, and
fires it as it fires a code schedule (each occurrence once, keyed ``cron:<name>:<fire time>``).
``list()`` shows both kinds; a code schedule is read-only here (change it in code).
``conveyor cron`` and ``/api/admin/cron`` are this object from a shell and over HTTP.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Literal

from conveyor.errors import InvalidSchedule, ScheduleNotFound
from conveyor.redaction import redact_payload
from conveyor.scheduling.checks import check_cron, check_grace, check_job, check_name
from conveyor.scheduling.cron import Cron
from conveyor.scheduling.firing import server_now
from conveyor.scheduling.store import StoredSchedule, schedule_store

if TYPE_CHECKING:
    from pydantic import BaseModel

    from conveyor.app import App
    from conveyor.scheduling.store import ScheduleStore


@dataclass(frozen=True)
class CronSchedule:
    """One schedule as ``app.cron`` shows it. ``source``: ``code`` (``jobs.schedule``, read-only) or ``managed``.

    ``next_fire``: its next occurrence after now (None while paused).
    """

    name: str
    cron: str
    tz: str
    job: str
    payload: dict[str, Any]
    paused: bool
    source: Literal["code", "managed"]
    next_fire: datetime | None


class CronSchedules:
    """Add, list, pause, resume and remove the App's managed cron schedules (see the module doc)."""

    def __init__(self, app: App) -> None:
        self.app = app

    @property
    def store(self) -> ScheduleStore:
        return schedule_store(self.app)

    def add(
        self,
        name: str,
        *,
        cron: str,
        job: str,
        payload: BaseModel | dict[str, Any] | None = None,
        tz: str = "UTC",
        paused: bool = False,
    ) -> CronSchedule:
        """Store the schedule ``name``, replacing the managed one of that name; it fires from the next pass.

        Everything is checked first (raises :class:`~conveyor.errors.InvalidSchedule`, nothing
        stored): the name (it keys each occurrence; one a code schedule has is refused), the cron
        expression and zone, the job (a job type of this App) and the payload (its model's).
        """
        check_grace(self.app.settings)
        name = check_name(self.app, name)
        check_cron(cron, tz)
        data = check_job(self.app, job, payload)
        held = self.store.get(name)
        # Replaced with the same times and running before and after: it keeps its ``since``, so an
        # occurrence of the grace window no pass has fired yet still fires (a deploy script that
        # adds its schedules again at 03:00:01 does not skip the 03:00 run).
        keeps = held is not None and not held.paused and not paused and (held.cron, held.tz) == (cron, tz)
        since = held.since if keeps and held is not None else server_now(self.app)
        self.store.put(StoredSchedule(name, cron, job, data, tz, paused, since))
        return self.get(name)

    def get(self, name: str) -> CronSchedule:
        """The schedule ``name``, code or managed; :class:`~conveyor.errors.ScheduleNotFound` if none."""
        spec = self.app.schedules.get(name)
        if spec is not None:
            return self._view(spec.name, spec.cron, spec.tz, spec.job, spec.payload, False, "code")
        held = self.store.get(name)
        if held is None:
            raise ScheduleNotFound("no schedule has this name")
        return self._managed(held)

    def list(self) -> list[CronSchedule]:
        """Every schedule by name: the code ones (``source="code"``) and the managed ones."""
        code = [self.get(name) for name in self.app.schedules]
        managed = [self._managed(s) for s in self.store.list() if s.name not in self.app.schedules]
        return sorted(code + managed, key=lambda s: s.name)

    def pause(self, name: str) -> CronSchedule:
        """Stop firing ``name`` from the next pass (its occurrences while paused are never fired; a pass
        already under way may still fire its due one)."""
        return self._set_paused(name, True, None)

    def resume(self, name: str) -> CronSchedule:
        """Fire ``name`` again, from its first occurrence after now (no catch-up of the paused time)."""
        return self._set_paused(name, False, server_now(self.app))

    def remove(self, name: str) -> None:
        """Delete the managed schedule ``name``; it fires no more from the next pass."""
        self._managed_only(name)
        if not self.store.delete(name):
            raise ScheduleNotFound("no schedule has this name")

    def _set_paused(self, name: str, paused: bool, since: datetime | None) -> CronSchedule:
        self._managed_only(name)
        if not self.store.set_paused(name, paused, since):
            raise ScheduleNotFound("no schedule has this name")
        return self.get(name)

    def _managed_only(self, name: str) -> None:
        if name in self.app.schedules:
            raise InvalidSchedule("this schedule is declared in code (jobs.schedule): change it there")

    def _managed(self, s: StoredSchedule) -> CronSchedule:
        return self._view(s.name, s.cron, s.tz, s.job, s.payload, s.paused, "managed")

    def _view(
        self,
        name: str,
        cron: str,
        tz: str,
        job: str,
        payload: dict[str, Any],
        paused: bool,
        source: Literal["code", "managed"],
    ) -> CronSchedule:
        """The schedule as shown: its payload's secret fields masked (a code schedule may have them)."""
        job_type = self.app.job_types.get(job)
        shown = redact_payload(payload, job_type.payload if job_type else None)
        try:
            upcoming = None if paused else Cron.parse(cron, tz).next_after(datetime.now(UTC))
        except InvalidSchedule:  # a zone this host's tzdata lacks: shown, not fired
            upcoming = None
        return CronSchedule(name, cron, tz, job, shown, paused, source, upcoming)
