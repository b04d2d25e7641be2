"""Results of the inline broker's jobs: in this process's memory, like its jobs."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

from conveyor.results.base import Entry, Watch


class MemoryResults:
    def __init__(self) -> None:
        self._entries: dict[str, tuple[Entry, float]] = {}
        self._versions: dict[str, int] = {}
        self._changed = threading.Condition()

    def put(self, job_id: str, job: str, entry: Entry, ttl: float) -> None:
        with self._changed:
            now = time.monotonic()
            for key in [k for k, (_, expires) in self._entries.items() if expires <= now]:
                del self._entries[key]
            held = self._entries.get(job_id)
            if held is not None and held[0].ok:
                return  # the first result stays
            self._entries[job_id] = (entry, now + ttl)
            self._versions[job_id] = self._versions.get(job_id, 0) + 1
            self._changed.notify_all()

    @contextmanager
    def watch(self, job_id: str) -> Iterator[Watch]:
        yield _MemoryWatch(self, job_id)

    def close(self) -> None:
        pass


class _MemoryWatch:
    def __init__(self, store: MemoryResults, job_id: str) -> None:
        self.store, self.job_id = store, job_id
        with store._changed:
            self.seen = store._versions.get(job_id, 0)

    def read(self) -> Entry | None:
        with self.store._changed:
            self.seen = self.store._versions.get(self.job_id, 0)
            held = self.store._entries.get(self.job_id)
            return held[0] if held and held[1] > time.monotonic() else None

    def wait(self, timeout: float) -> None:
        with self.store._changed:
            self.store._changed.wait_for(lambda: self.store._versions.get(self.job_id, 0) != self.seen, timeout)
