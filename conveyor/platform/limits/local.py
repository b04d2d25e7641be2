"""Limits for the inline broker: its workers all live in this process, so the fleet is this process."""

from __future__ import annotations

import threading
from collections import defaultdict

from conveyor.platform.limits.base import Semaphore, Slot


class _LocalSlot(Slot):
    def __init__(self, owner: "LocalSemaphore", name: str) -> None:
        self._owner, self._name, self._released = owner, name, False

    def release(self) -> None:
        with self._owner._lock:
            if not self._released:
                self._released = True
                self._owner._held[self._name] -= 1


class LocalSemaphore(Semaphore):
    """Counts holders per name under a lock."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._held: dict[str, int] = defaultdict(int)

    def try_acquire(self, name: str, limit: int) -> Slot | None:
        with self._lock:
            if self._held[name] >= limit:
                return None
            self._held[name] += 1
            return _LocalSlot(self, name)
