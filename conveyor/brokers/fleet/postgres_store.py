"""The worker registry and attempt history in Postgres, in tables of their own (``0045_fleet.sql``).

Enqueue totals need no writes from here: a statement trigger on
``conveyor_jobs`` counts every inserted job in the enqueue's own transaction.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from conveyor.brokers.fleet.base import FORGET_AFTER, AttemptEvent, AttemptInfo, FleetStore, WorkerInfo
from conveyor.db import load_queries

if TYPE_CHECKING:
    from conveyor.brokers.base import PoolOwner

QUERIES = load_queries(Path(__file__).with_name("fleet.sql"))

#: Seconds between passes that forget old workers and prune old attempts (per process).
PRUNE_INTERVAL = 60.0

#: Attempts per prune statement, and statements per pass. A pass that ends on a full batch is
#: behind (more attempts finish than a pass deletes): the next beat prunes again, not a minute later.
PRUNE_BATCH = 1000
PRUNE_BATCHES = 10


class PostgresFleetStore(FleetStore):
    counts_enqueues = True  # the insert trigger, in the enqueue's own transaction

    def __init__(self, app: PoolOwner, *, retention: float) -> None:
        self.app = app
        #: Seconds attempts are kept (CONVEYOR_RETENTION), as the broker keeps its jobs.
        self.retention = retention
        self._pruned_at = -PRUNE_INTERVAL

    def _execute(self, name: str, params: dict[str, Any] | None = None) -> int:
        """Run one statement; how many rows it changed."""
        with self.app.pool.connection() as conn:
            return conn.execute(QUERIES[name], params or {}).rowcount

    def _rows(self, name: str, params: dict[str, Any] | None = None) -> list[tuple[Any, ...]]:
        """Run one query; its rows."""
        with self.app.pool.connection() as conn:
            rows: list[tuple[Any, ...]] = conn.execute(QUERIES[name], params or {}).fetchall()
            return rows

    def beat(self, info: WorkerInfo, *, keep: float) -> None:
        self._execute(
            "beat",
            {
                "id": info.id,
                "host": info.host,
                "pid": info.pid,
                "queues": info.queues,
                "threads": info.threads,
                "version": info.version,
                "in_flight": info.in_flight,
                "done": info.done,
                "failed": info.failed,
            },
        )

    def leave(self, info: WorkerInfo, reason: str) -> None:
        self._execute("leave", {"id": info.id, "reason": reason, "done": info.done, "failed": info.failed})

    def sweep(self, gone_after: float) -> int:
        marked = self._execute("sweep", {"gone_after": gone_after})
        if time.monotonic() - self._pruned_at >= PRUNE_INTERVAL:  # the retention is days: no need to hurry
            self._pruned_at = time.monotonic()
            self._execute("forget", {"after": FORGET_AFTER})
            if self.prune_attempts() >= PRUNE_BATCH * PRUNE_BATCHES:
                self._pruned_at = -PRUNE_INTERVAL
        return marked

    def prune_attempts(self) -> int:
        """Delete attempts older than the retention, a batch per statement, a pass at most; how many."""
        total = 0
        for _ in range(PRUNE_BATCHES):
            count = self._execute("prune_attempts", {"retention": self.retention, "limit": PRUNE_BATCH})
            total += count
            if count < PRUNE_BATCH:
                break
        return total

    def workers(self) -> tuple[float, list[WorkerInfo]]:
        rows = self._rows("workers")
        if not rows:
            return self._rows("now")[0][0], []
        out = [
            WorkerInfo(
                id=r[1],
                host=r[2],
                pid=r[3],
                queues=list(r[4]),
                threads=r[5],
                version=r[6],
                started_at=r[7],
                heartbeat_at=r[8],
                in_flight=list(r[9]),
                done=r[10],
                failed=r[11],
                gone_at=r[12],
                gone_reason=r[13],
            )
            for r in rows
        ]
        return rows[0][0], out

    def write_attempts(self, events: list[AttemptEvent], *, keep: float) -> None:
        # A start and an end of one attempt set different columns of its row, so starts, ends and
        # whole attempts (both, merged by the middleware: one row version) can go as separate
        # batches in any order.
        batches: dict[str, list[dict[str, object]]] = {"attempt_start": [], "attempt_end": [], "attempt_full": []}
        for e in events:
            params = {"job_id": e.job_id, "token": e.token, "attempt": e.attempt, "worker": e.worker, "age": e.age}
            if e.kind == "start":
                batches["attempt_start"].append(params)
                continue
            params.update(outcome=e.outcome, error=e.error, traceback=e.traceback)
            if e.kind == "full":
                batches["attempt_full"].append({**params, "start_age": e.start_age or 0.0})
            else:
                batches["attempt_end"].append(params)
        with self.app.pool.connection() as conn, conn.transaction(), conn.cursor() as cur:
            for query, rows in batches.items():
                if rows:
                    cur.executemany(QUERIES[query], rows)

    def attempts(self, job_id: str) -> list[AttemptInfo]:
        return [AttemptInfo(*row) for row in self._rows("attempts", {"job_id": job_id})]

    def count_enqueued(self, counts: dict[tuple[str, str], int]) -> None:
        pass  # the insert trigger counted them, in the enqueue's own transaction

    def enqueued_totals(self) -> dict[tuple[str, str], int]:
        return {(q, j): int(n) for q, j, n in self._rows("enqueued_totals")}

    def find_by_key(self, key: str) -> list[str]:
        return [row[0] for row in self._rows("find_by_key", {"key": key})]
