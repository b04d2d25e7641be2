"""The rollup in Postgres, in a table of its own (``0070_rollup.sql``), on the App's pool.

A flush is one transaction: its id is claimed first (a retried flush that had
in fact committed adds nothing), then every group is upserted, in (queue,
job, oldest first) order so two processes' flushes lock shared rows in the
same order and never deadlock.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from conveyor.brokers.rollup.base import (
    FLUSH_ID_SECONDS,
    KEEP_SECONDS,
    MinuteRow,
    RollupStore,
    Tally,
    TallyGroup,
    empty_hist,
)
from conveyor.db import load_queries

if TYPE_CHECKING:
    from conveyor.brokers.base import PoolOwner

QUERIES = load_queries(Path(__file__).with_name("rollup.sql"))


class PostgresRollupStore(RollupStore):
    def __init__(self, app: PoolOwner) -> None:
        self.app = app

    def write(self, flush_id: str, groups: list[TallyGroup]) -> bool:
        ordered = sorted(groups, key=lambda g: (g.queue, g.job, -g.age))
        params = [
            {
                "queue": g.queue,
                "job": g.job,
                "age": g.age,
                "enqueued": g.tally.enqueued,
                "completed": g.tally.completed,
                "failed": g.tally.failed,
                "retried": g.tally.retried,
                "wait": g.tally.wait,
                "run": g.tally.run,
            }
            for g in ordered
        ]
        with self.app.pool.connection() as conn, conn.transaction(), conn.cursor() as cur:
            if cur.execute(QUERIES["claim_flush"], {"id": flush_id}).rowcount == 0:
                return False
            if params:
                cur.executemany(QUERIES["add"], params)
        return True

    def sample_depth(self, depths: dict[str, int]) -> None:
        if not depths:
            return
        with self.app.pool.connection() as conn, conn.transaction(), conn.cursor() as cur:
            cur.executemany(QUERIES["sample_depth"], [{"queue": q, "depth": n} for q, n in sorted(depths.items())])

    def read(self, queue: str | None, seconds: float) -> tuple[int, list[MinuteRow]]:
        with self.app.pool.connection() as conn:
            now = conn.execute(QUERIES["now"]).fetchone()
            rows: list[tuple[Any, ...]] = conn.execute(QUERIES["read"], {"queue": queue, "seconds": seconds}).fetchall()
        assert now is not None
        out = [
            MinuteRow(
                minute=int(r[0]),
                queue=r[1],
                job=r[2],
                tally=Tally(int(r[3]), int(r[4]), int(r[5]), int(r[6]), _hist(r[7]), _hist(r[8])),
                depth=None if r[9] is None else int(r[9]),
            )
            for r in rows
        ]
        return int(now[0]), out

    def prune(self) -> int:
        with self.app.pool.connection() as conn:
            gone = conn.execute(QUERIES["prune"], {"keep": KEEP_SECONDS + 120}).rowcount
            conn.execute(QUERIES["prune_flushes"], {"keep": FLUSH_ID_SECONDS})
        return gone


def _hist(values: list[int] | None) -> list[int]:
    hist = empty_hist()
    for i, n in enumerate(values or []):
        if i < len(hist):
            hist[i] = int(n)
    return hist
