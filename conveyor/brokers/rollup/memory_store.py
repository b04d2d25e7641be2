"""The rollup of the inline broker: in memory, like its jobs."""

from __future__ import annotations

import copy
import threading
import time

from conveyor.brokers.rollup.base import KEEP_SECONDS, MinuteRow, RollupStore, Tally, TallyGroup


class MemoryRollupStore(RollupStore):
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._rows: dict[tuple[str, int, str], MinuteRow] = {}
        self._flushes: set[str] = set()

    def _row(self, queue: str, minute: int, job: str) -> MinuteRow:
        return self._rows.setdefault((queue, minute, job), MinuteRow(minute, queue, job, Tally()))

    def write(self, flush_id: str, groups: list[TallyGroup]) -> bool:
        now = time.time()
        with self._lock:
            if flush_id in self._flushes:
                return False
            self._flushes.add(flush_id)
            for g in groups:
                at = now - g.age
                self._row(g.queue, int(at - at % 60), g.job).tally.add(g.tally)
        return True

    def sample_depth(self, depths: dict[str, int]) -> None:
        now = int(time.time())
        with self._lock:
            for queue, n in depths.items():
                key = (queue, now - now % 60, "")
                row = self._rows.get(key) or MinuteRow(now - now % 60, queue, "", Tally())
                self._rows[key] = MinuteRow(row.minute, queue, "", row.tally, n)

    def read(self, queue: str | None, seconds: float) -> tuple[int, list[MinuteRow]]:
        now = int(time.time())
        first = now - now % 60 - int(seconds) // 60 * 60
        with self._lock:
            rows = [
                copy.deepcopy(r) for (q, m, _), r in self._rows.items() if m >= first and (queue is None or q == queue)
            ]
        return now, sorted(rows, key=lambda r: (r.minute, r.queue, r.job))

    def prune(self) -> int:
        now = time.time()
        with self._lock:
            old = [k for k in self._rows if k[1] < now - KEEP_SECONDS - 120]
            for k in old:
                del self._rows[k]
            self._flushes.clear()  # the inline broker's flushes are never retried
        return len(old)
