"""The Postgres stream buffer (postgres broker and embedded default): the ``run_chunks`` table.

Readers poll (``CONVEYOR_STREAM_POLL_INTERVAL``) rather than LISTEN: a
NOTIFY per chunk would serialise every chunk's commit behind the
cluster-wide notify lock.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from conveyor.db import load_queries
from conveyor.platform.streams.base import READ_BATCH, StreamBuffer, StreamEntry

if TYPE_CHECKING:
    from psycopg_pool import ConnectionPool

QUERIES = load_queries(Path(__file__).with_name("postgres.sql"))


class PostgresStreamBuffer(StreamBuffer):
    """Chunks as rows keyed by (run_id, seq), on the app's pool."""

    def __init__(self, pool: ConnectionPool) -> None:
        self.pool = pool

    def append(self, run_id: str, seq: int, text: str) -> bool:
        with self.pool.connection() as conn:
            return conn.execute(QUERIES["append"], {"run_id": run_id, "seq": seq, "data": text}).fetchone() is not None

    def end(self, run_id: str, status: str) -> None:
        with self.pool.connection() as conn:
            conn.execute(QUERIES["end"], {"run_id": run_id, "data": status})

    def read(self, run_id: str, after: int = 0, limit: int = READ_BATCH) -> list[StreamEntry]:
        with self.pool.connection() as conn:
            rows = conn.execute(QUERIES["read"], {"run_id": run_id, "after": after, "limit": limit}).fetchall()
        return [StreamEntry(*row) for row in rows]
