"""What every store of managed cron schedules offers (memory, Postgres, Redis): put, get, list, pause, delete."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol


@dataclass(frozen=True)
class StoredSchedule:
    """A cron schedule added at run time (``app.cron.add``, ``conveyor cron add``, the admin API).

    ``since``: when it was stored or last resumed, by the broker's server clock; no occurrence
    before it fires (a new or resumed schedule does not catch up on what fell before it).
    """

    name: str
    cron: str
    job: str
    payload: dict[str, Any]
    tz: str
    paused: bool
    since: datetime


class ScheduleStore(Protocol):
    def put(self, schedule: StoredSchedule) -> None:
        """Create the schedule, or replace the one of the same name."""

    def get(self, name: str) -> StoredSchedule | None: ...

    def list(self) -> list[StoredSchedule]:
        """Every stored schedule, paused ones too, by name: one query (one HGETALL)."""

    def set_paused(self, name: str, paused: bool, since: datetime | None = None) -> bool:
        """Pause or resume ``name`` (and move its ``since`` when given); False if there is none."""

    def delete(self, name: str) -> bool:
        """Remove ``name``; False if there was none."""

    def close(self) -> None: ...
