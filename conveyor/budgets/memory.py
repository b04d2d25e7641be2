"""Budgets for the inline broker: its workers all live in this process, so the fleet is this process."""

from __future__ import annotations

import threading
import time
from collections import defaultdict, deque
from typing import Sequence

from conveyor.budgets.base import MAX_USAGE_KEYS, BudgetStore, BudgetUsage, KeyUsage, Take, admits, key_prefix


class MemoryBudgets(BudgetStore):
    """Sliding-window logs in memory, under one lock."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._logs: dict[str, deque[tuple[float, float]]] = defaultdict(deque)

    def take(self, takes: Sequence[Take]) -> list[float]:
        with self._lock:
            now = time.monotonic()
            waits = [self._wait(t, now) for t in takes]
            if not any(waits):
                for t in takes:
                    if t.weight:
                        self._logs[t.key].append((now, t.weight))
            return waits

    def spend(self, take: Take) -> None:
        with self._lock:
            self._logs[take.key].append((time.monotonic(), take.weight))

    def usage(self, name: str, per: float, limit: int) -> BudgetUsage:
        with self._lock:
            now = time.monotonic()
            found = []
            for key, log in self._logs.items():
                if key == name or key.startswith(key_prefix(name)):
                    used = sum(w for at, w in log if at > now - per)
                    if used > 0:
                        found.append(KeyUsage(key, used))
        found.sort(key=lambda k: (-k.used, k.key))
        return BudgetUsage(found[: max(0, limit)], min(len(found), MAX_USAGE_KEYS))

    def _wait(self, take: Take, now: float) -> float:
        log = self._logs[take.key]
        while log and log[0][0] <= now - take.per:
            log.popleft()
        if not log:
            del self._logs[take.key]  # a key no job asks for again holds nothing
            return 0.0
        total = sum(w for _, w in log)
        if admits(total, take.weight, take.limit):
            return 0.0
        for at, weight in log:
            total -= weight
            if admits(total, take.weight, take.limit):
                return max(at + take.per - now, 0.001)
        return take.per  # not reached: an empty window admits
