"""The Postgres stream buffer (postgres broker and embedded default): the ``run_chunks`` table.

Readers wait on a wake-up, not a timer: an append notifies ``conveyor_stream``
(the run id) in its own statement, and one LISTEN connection per process,
on a thread of its own, wakes that run's readers. A wake-up that is lost
(the listener reconnecting) costs a reader at most its wait's timeout: it
reads the table again then. The notify is one per chunk: NOTIFY's commit
lock is the price of a chunk reaching its reader at once.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import TYPE_CHECKING

import psycopg

from conveyor.db import load_queries
from conveyor.platform.streams.base import READ_BATCH, Follower, StreamBuffer, StreamEntry, Wakeups

if TYPE_CHECKING:
    from psycopg_pool import ConnectionPool

QUERIES = load_queries(Path(__file__).with_name("postgres.sql"))

#: Seconds between the listener's looks at whether it should stop, and its wait before reconnecting.
LISTEN_TICK = 1.0


class PostgresStreamBuffer(StreamBuffer):
    """Chunks as rows keyed by (run_id, seq), on the app's pool; one LISTEN connection for its readers."""

    def __init__(self, pool: ConnectionPool, listen_url: str | None = None, *, pooled: bool = False) -> None:
        self.pool = pool
        #: A direct URL for LISTEN when the pool goes through a transaction-mode pooler (PgBouncer).
        self.listen_url = listen_url
        #: False behind a transaction-mode pooler without a direct URL: no LISTEN (its notifications would
        #: reach whichever client holds that server connection); readers then read again at their timeout.
        self.listens = bool(listen_url) or not pooled
        self._wakeups = Wakeups()
        self._stop = threading.Event()
        self._listener: threading.Thread | None = None
        self._start = threading.Lock()

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

    @asynccontextmanager
    async def follow(self, run_id: str) -> AsyncIterator[Follower]:
        self._ensure_listener()
        async with self._wakeups.follower(self, run_id) as follower:
            yield follower

    def _ensure_listener(self) -> None:
        with self._start:
            if self._listener is None and not self._stop.is_set() and self.listens:
                self._listener = threading.Thread(target=self._listen, name="conveyor-stream-listen", daemon=True)
                self._listener.start()

    def _listen(self) -> None:
        """LISTEN until closed; reconnect after a lost connection (and wake every reader: news may be lost)."""
        while not self._stop.is_set():
            try:
                conninfo = self.listen_url or self.pool.conninfo
                with psycopg.connect(conninfo if isinstance(conninfo, str) else conninfo(), autocommit=True) as conn:
                    conn.execute(QUERIES["listen"])
                    self._wakeups.wake_all()
                    while not self._stop.is_set():
                        for note in conn.notifies(timeout=LISTEN_TICK):
                            self._wakeups.wake(note.payload)
            except psycopg.Error:
                self._stop.wait(LISTEN_TICK)

    def close(self) -> None:
        self._stop.set()
        listener, self._listener = self._listener, None
        if listener is not None:
            with contextlib.suppress(RuntimeError):
                listener.join(LISTEN_TICK * 3)
