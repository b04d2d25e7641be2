"""Limits on Postgres (postgres broker, embedded default).

The semaphore is N advisory locks: a slot is ``pg_try_advisory_lock(name, i)``
for some free ``i < N``, held by a connection kept out of the pool for the
slot's lifetime. A worker that dies loses its session, and Postgres frees
its slot at once: no lease to expire, nothing to clean up.
"""

from __future__ import annotations

import zlib
from pathlib import Path
from typing import TYPE_CHECKING

import psycopg

from conveyor.db import load_queries, wrap_errors
from conveyor.platform.limits.base import Semaphore, Slot

if TYPE_CHECKING:
    from psycopg.rows import TupleRow
    from psycopg_pool import ConnectionPool

QUERIES = load_queries(Path(__file__).with_name("postgres.sql"))


def lock_class(name: str) -> int:
    """The advisory lock's first key for ``name``: a stable signed 32-bit hash."""
    value = zlib.crc32(f"conveyor:limit:{name}".encode())
    return value - (1 << 32) if value >= 1 << 31 else value


class _AdvisorySlot(Slot):
    def __init__(self, pool: ConnectionPool, conn: psycopg.Connection[TupleRow], key: int, index: int) -> None:
        self._pool, self._key, self._index = pool, key, index
        self._conn: psycopg.Connection[TupleRow] | None = conn

    def release(self) -> None:
        conn, self._conn = self._conn, None
        if conn is None:
            return
        try:
            conn.execute(QUERIES["release"], {"key": self._key, "slot": self._index})
        except psycopg.Error:
            conn.close()  # a broken session holds no locks any more; the pool drops a closed connection
        finally:
            self._pool.putconn(conn)


class PostgresSemaphore(Semaphore):
    """N session-level advisory locks per name."""

    def __init__(self, pool: ConnectionPool) -> None:
        self.pool = pool

    @wrap_errors("acquiring a slot")  # a connection out of the pool: no `with pool.connection()` translates
    def try_acquire(self, name: str, limit: int) -> Slot | None:
        key = lock_class(name)
        conn = self.pool.getconn()
        try:
            row = conn.execute(QUERIES["acquire"], {"key": key, "limit": limit}).fetchone()
        except BaseException:
            self.pool.putconn(conn)
            raise
        if row is None:
            self.pool.putconn(conn)
            return None
        return _AdvisorySlot(self.pool, conn, key, row[0])
