"""Cron expressions in a time zone: parsing and occurrences by croniter, zones by zoneinfo.

Standard five-field expressions (``minute hour day-of-month month day-of-week``)
and croniter's ``@hourly``-style aliases, evaluated in the schedule's IANA zone.
Across daylight-saving changes, as cron does:

- **Spring forward**: a wall time that does not exist that day (02:30 in
  Europe/Berlin on the last Sunday of March) fires once, at the first moment
  after the gap (03:00); schedules that run every hour just skip the missing hour.
- **Fall back**: a wall time that happens twice (02:30 on the last Sunday of
  October) fires once, at its first occurrence; only schedules that run every
  hour fire in the repeated hour again, since that hour really passes twice.

Every time this module returns is timezone-aware UTC.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from croniter import CroniterBadDateError, CroniterError, croniter

from conveyor.errors import InvalidSchedule


def parse_zone(name: str) -> ZoneInfo:
    """The IANA zone ``name``, or InvalidSchedule."""
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        raise InvalidSchedule(
            f"unknown time zone {name!r}: use an IANA name such as 'UTC' or 'Europe/Berlin'"
        ) from None


@dataclass(frozen=True)
class Cron:
    """A validated cron expression in a zone."""

    expression: str
    zone: ZoneInfo
    _every_hour: bool = field(repr=False, compare=False, default=False)

    @classmethod
    def parse(cls, expression: str, timezone: str = "UTC") -> "Cron":
        """Validate ``expression`` and ``timezone``; raise InvalidSchedule saying what is wrong."""
        expression = " ".join(expression.split())
        zone = parse_zone(timezone)
        if not expression.startswith("@") and len(expression.split()) != 5:
            raise InvalidSchedule(
                f"cron expression {expression!r} must have 5 fields "
                "(minute hour day-of-month month day-of-week) or be an alias like @daily"
            )
        try:
            parsed = croniter(expression, datetime.now(zone))
        except CroniterError as exc:
            raise InvalidSchedule(f"invalid cron expression {expression!r}: {exc}") from None
        cron = cls(expression, zone, parsed.expanded[1] == ["*"])
        try:
            cron.next_after(datetime.now(UTC))
        except CroniterBadDateError:
            raise InvalidSchedule(f"cron expression {expression!r} never fires") from None
        return cron

    def next_after(self, moment: datetime) -> datetime:
        """The first occurrence strictly after ``moment``."""
        it = croniter(self.expression, moment.astimezone(self.zone))
        while True:
            candidate: datetime = it.get_next(datetime)
            if not self._is_repeat(candidate):
                return candidate.astimezone(UTC)

    def latest_at_or_before(self, moment: datetime) -> datetime | None:
        """The last occurrence at or before ``moment`` (None if there is none in croniter's search range)."""
        # croniter's get_prev is strictly before its start; occurrences are whole seconds.
        start = moment.astimezone(self.zone).replace(microsecond=0) + timedelta(seconds=1)
        it = croniter(self.expression, start)
        try:
            while True:
                candidate: datetime = it.get_prev(datetime)
                if not self._is_repeat(candidate):
                    return candidate.astimezone(UTC)
        except CroniterBadDateError:
            return None

    def between(self, first: datetime, last: datetime, limit: int) -> list[datetime]:
        """Occurrences from ``first`` (itself included when it is one) through ``last``, at most ``limit``."""
        out: list[datetime] = []
        moment = first - timedelta(seconds=1)
        while len(out) < limit:
            moment = self.next_after(moment)
            if moment > last:
                break
            out.append(moment)
        return out

    def _is_repeat(self, candidate: datetime) -> bool:
        """True for the second occurrence of a wall time repeated by a fall-back, unless the schedule is hourly."""
        if self._every_hour:
            return False
        wall = candidate.replace(tzinfo=None)
        first = wall.replace(tzinfo=self.zone, fold=0).utcoffset()
        second = wall.replace(tzinfo=self.zone, fold=1).utcoffset()
        return first != second and candidate.utcoffset() == second
