"""Managed schedules in Postgres: the table ``conveyor_cron_schedules`` (migration ``0078_cron_schedules.sql``).

Every operation is one statement on a pooled connection, nothing held between them.
"""

from __future__ import annotations

from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from psycopg.types.json import Jsonb

from conveyor.db import load_queries
from conveyor.scheduling.store.base import StoredSchedule

if TYPE_CHECKING:
    from conveyor.app import App

QUERIES = load_queries(Path(__file__).with_name("schedules.sql"))


class PostgresSchedules:
    def __init__(self, app: App) -> None:
        self.app = app

    def _rows(self, query: str, params: dict[str, Any]) -> list[tuple[Any, ...]]:
        with self.app.pool.connection() as conn:
            return conn.execute(QUERIES[query], params).fetchall()

    def _count(self, query: str, params: dict[str, Any]) -> int:
        """How many rows ``query`` changed."""
        with self.app.pool.connection() as conn:
            return conn.execute(QUERIES[query], params).rowcount

    def put(self, schedule: StoredSchedule) -> None:
        s = schedule
        params = {"name": s.name, "cron": s.cron, "tz": s.tz, "job": s.job, "payload": Jsonb(s.payload)}
        self._count("put", {**params, "paused": s.paused, "since": s.since})

    def get(self, name: str) -> StoredSchedule | None:
        rows = self._rows("get", {"name": name})
        return _schedule(rows[0]) if rows else None

    def list(self) -> list[StoredSchedule]:
        return [_schedule(row) for row in self._rows("list", {})]

    def set_paused(self, name: str, paused: bool, since: datetime | None = None) -> bool:
        return self._count("set_paused", {"name": name, "paused": paused, "since": since}) == 1

    def delete(self, name: str) -> bool:
        return self._count("delete", {"name": name}) == 1

    def close(self) -> None:
        pass


def _schedule(row: tuple[Any, ...]) -> StoredSchedule:
    name, cron, tz, job, payload, paused, since = row
    return StoredSchedule(name, cron, job, payload, tz, paused, since)
