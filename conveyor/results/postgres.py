"""Results in Postgres (``conveyor_results``, migration ``0060_results.sql``), woken by ``LISTEN``.

A write notifies ``conveyor_results`` with the job's id in its own transaction (only jobs
that store results pay for the NOTIFY); a reader opens a connection of its own, LISTENs,
then reads, so a result committed between the two still wakes it. Expired rows are pruned
a batch at a time by the writes themselves.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

from conveyor.db import Connection, connect, load_queries
from conveyor.results.base import Entry, Watch

if TYPE_CHECKING:
    from conveyor.app import App

QUERIES = load_queries(Path(__file__).with_name("results.sql"))


class PostgresResults:
    def __init__(self, app: App) -> None:
        self.app = app

    def put(self, job_id: str, job: str, entry: Entry, ttl: float) -> None:
        params = {"job_id": job_id, "job": job, "ok": entry.ok, "value": entry.value, "ttl": ttl}
        with self.app.pool.connection() as conn, conn.transaction():
            conn.execute(QUERIES["prune"])
            conn.execute(QUERIES["put"], params)
            conn.execute(QUERIES["notify"], params)

    @contextmanager
    def watch(self, job_id: str) -> Iterator[Watch]:
        with connect(self.app.database_url, autocommit=True) as conn:
            conn.execute(QUERIES["listen"])
            yield _PostgresWatch(conn, job_id)

    def close(self) -> None:
        pass


class _PostgresWatch:
    def __init__(self, conn: Connection, job_id: str) -> None:
        self.conn, self.job_id = conn, job_id

    def read(self) -> Entry | None:
        row = self.conn.execute(QUERIES["read"], {"job_id": self.job_id}).fetchone()
        return Entry(bool(row[0]), row[1]) if row else None

    def wait(self, timeout: float) -> None:
        for note in self.conn.notifies(timeout=max(0.0, timeout)):
            if note.payload == self.job_id:
                return
