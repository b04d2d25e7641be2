"""Limits for the inline broker: its workers all live in this process, so the fleet is this process."""

from __future__ import annotations

import math
import threading
import time
from collections import defaultdict

from conveyor.platform.limits.base import RateLimit, Semaphore, Slot


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


class LocalRateLimit(RateLimit):
    """Fixed windows counted in memory."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._windows: dict[str, tuple[int, int]] = {}

    def hit(self, name: str, limit: int, window: float) -> float:
        now = time.time()
        index = math.floor(now / window)
        with self._lock:
            current, hits = self._windows.get(name, (index, 0))
            if current != index:
                hits = 0
            if hits >= limit:
                self._windows[name] = (index, hits)
                return (index + 1) * window - now
            self._windows[name] = (index, hits + 1)
            return 0.0
