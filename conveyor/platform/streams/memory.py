"""The inline broker's stream buffer: in this process's memory, gone when it exits."""

from __future__ import annotations

import threading

from conveyor.platform.streams.base import READ_BATCH, StreamBuffer, StreamEntry


class MemoryStreamBuffer(StreamBuffer):
    """Entries per run in a dict; safe across threads."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._runs: dict[str, list[StreamEntry]] = {}

    def append(self, run_id: str, seq: int, text: str) -> bool:
        with self._lock:
            entries = self._runs.setdefault(run_id, [])
            last = entries[-1] if entries else None
            if last is not None and (last.kind == "end" or seq <= last.seq):
                return False
            entries.append(StreamEntry(seq, "chunk", text))
            return True

    def end(self, run_id: str, status: str) -> None:
        with self._lock:
            entries = self._runs.setdefault(run_id, [])
            if entries and entries[-1].kind == "end":
                return
            entries.append(StreamEntry(entries[-1].seq + 1 if entries else 1, "end", status))

    def read(self, run_id: str, after: int = 0, limit: int = READ_BATCH) -> list[StreamEntry]:
        with self._lock:
            return [e for e in self._runs.get(run_id, ()) if e.seq > after][:limit]
