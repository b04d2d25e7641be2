"""The worker registry and attempt history of the inline broker: in memory, like its jobs."""

from __future__ import annotations

import dataclasses
import threading
import time
from collections import defaultdict
from typing import TYPE_CHECKING

from conveyor.brokers.fleet.base import AttemptEvent, AttemptInfo, FleetStore, WorkerInfo

if TYPE_CHECKING:
    from conveyor.brokers.inline import InlineBroker

#: Jobs whose attempts are kept (this process's memory is the limit, not a retention).
MAX_JOBS = 10000


class MemoryFleetStore(FleetStore):
    def __init__(self, broker: InlineBroker) -> None:
        self.broker = broker
        self._lock = threading.Lock()
        self._workers: dict[str, WorkerInfo] = {}
        self._attempts: dict[str, dict[str, AttemptInfo]] = defaultdict(dict)
        self._enqueued: dict[tuple[str, str], int] = defaultdict(int)

    def beat(self, info: WorkerInfo, *, keep: float) -> None:
        now = time.time()
        with self._lock:
            known = self._workers.get(info.id)
            self._workers[info.id] = dataclasses.replace(
                info,
                started_at=known.started_at if known else now,
                heartbeat_at=now,
                gone_at=None,
                gone_reason=None,
                in_flight=list(info.in_flight),
                queues=list(info.queues),
            )

    def leave(self, info: WorkerInfo, reason: str) -> None:
        with self._lock:
            known = self._workers.get(info.id)
            if known:
                self._workers[info.id] = dataclasses.replace(
                    known, gone_at=time.time(), gone_reason=reason, in_flight=[], done=info.done, failed=info.failed
                )

    def sweep(self, gone_after: float) -> int:
        return 0  # inline workers live and die with this process

    def workers(self) -> tuple[float, list[WorkerInfo]]:
        with self._lock:
            return time.time(), [dataclasses.replace(w) for w in self._workers.values()]

    def write_attempts(self, events: list[AttemptEvent], *, keep: float) -> None:
        now = time.time()
        with self._lock:
            for e in events:
                if e.job_id not in self._attempts and len(self._attempts) >= MAX_JOBS:
                    del self._attempts[next(iter(self._attempts))]  # the oldest job's history goes first
                entry = self._attempts[e.job_id].setdefault(e.token, AttemptInfo(e.attempt, e.worker, None))
                if e.kind == "start":
                    entry.started_at = now - e.age
                else:
                    if e.kind == "full":
                        entry.started_at = now - (e.start_age or 0.0)
                    entry.ended_at, entry.outcome = now - e.age, e.outcome
                    entry.error, entry.traceback = e.error, e.traceback

    def attempts(self, job_id: str) -> list[AttemptInfo]:
        with self._lock:
            entries = [dataclasses.replace(a) for a in self._attempts.get(job_id, {}).values()]
        return sorted(entries, key=lambda a: (a.started_at or a.ended_at or 0, a.attempt))

    def count_enqueued(self, counts: dict[tuple[str, str], int]) -> None:
        with self._lock:
            for key, n in counts.items():
                self._enqueued[key] += n

    def enqueued_totals(self) -> dict[tuple[str, str], int]:
        with self._lock:
            return dict(self._enqueued)

    def find_by_key(self, key: str) -> list[str]:
        return [r.id for r in list(self.broker.records.values()) if r.key == key]
