"""Managed schedules of the inline broker: in this process's memory, like its jobs."""

from __future__ import annotations

import threading
from dataclasses import replace
from datetime import datetime

from conveyor.scheduling.store.base import StoredSchedule


class MemorySchedules:
    def __init__(self) -> None:
        self._schedules: dict[str, StoredSchedule] = {}
        self._lock = threading.Lock()

    def put(self, schedule: StoredSchedule) -> None:
        with self._lock:
            self._schedules[schedule.name] = schedule

    def get(self, name: str) -> StoredSchedule | None:
        with self._lock:
            return self._schedules.get(name)

    def list(self) -> list[StoredSchedule]:
        with self._lock:
            return [self._schedules[name] for name in sorted(self._schedules)]

    def set_paused(self, name: str, paused: bool, since: datetime | None = None) -> bool:
        with self._lock:
            held = self._schedules.get(name)
            if held is None:
                return False
            self._schedules[name] = replace(held, paused=paused, since=since or held.since)
            return True

    def delete(self, name: str) -> bool:
        with self._lock:
            return self._schedules.pop(name, None) is not None

    def close(self) -> None:
        pass
