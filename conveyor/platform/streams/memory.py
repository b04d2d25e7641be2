"""The inline broker's stream buffer: in this process's memory, gone when it exits."""

from __future__ import annotations

import threading
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from conveyor.platform.streams.base import READ_BATCH, Follower, StreamBuffer, StreamEntry, Wakeups


class MemoryStreamBuffer(StreamBuffer):
    """Entries per run in a dict; safe across threads. An append wakes that run's readers."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._runs: dict[str, list[StreamEntry]] = {}
        self._wakeups = Wakeups()

    def append(self, run_id: str, seq: int, text: str) -> bool:
        with self._lock:
            entries = self._runs.setdefault(run_id, [])
            last = entries[-1] if entries else None
            if last is not None and (last.kind == "end" or seq <= last.seq):
                return False
            entries.append(StreamEntry(seq, "chunk", text))
        self._wakeups.wake(run_id)
        return True

    def end(self, run_id: str, status: str) -> None:
        with self._lock:
            entries = self._runs.setdefault(run_id, [])
            if entries and entries[-1].kind == "end":
                return
            entries.append(StreamEntry(entries[-1].seq + 1 if entries else 1, "end", status))
        self._wakeups.wake(run_id)

    def read(self, run_id: str, after: int = 0, limit: int = READ_BATCH) -> list[StreamEntry]:
        with self._lock:
            return [e for e in self._runs.get(run_id, ()) if e.seq > after][:limit]

    @asynccontextmanager
    async def follow(self, run_id: str) -> AsyncIterator[Follower]:
        async with self._wakeups.follower(self, run_id) as follower:
            yield follower
