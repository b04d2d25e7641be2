"""Budgets on Redis (redis broker): one sorted set per budget key, checked and written by one Lua script."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Sequence

import redis

from conveyor.budgets.base import MAX_USAGE_KEYS, BudgetStore, BudgetUsage, KeyUsage, Take, key_prefix
from conveyor.redis_client import wrap_errors

_SCRIPT = Path(__file__).with_name("budgets.lua").read_text()


class RedisBudgets(BudgetStore):
    """Windows in ``<namespace>:budget:<name>[:<key>]``; the script runs atomically on the server."""

    def __init__(self, client: redis.Redis, namespace: str) -> None:
        self.client, self.namespace = client, namespace
        self._script = client.register_script(_SCRIPT)

    def _args(self, command: str, takes: Sequence[Take]) -> tuple[list[str], list[str | float]]:
        args: list[str | float] = [command, uuid.uuid4().hex]
        for t in takes:
            args += [t.limit, t.per * 1000, t.weight]
        return [f"{self.namespace}:budget:{t.key}" for t in takes], args

    @wrap_errors("taking from a budget")
    def take(self, takes: Sequence[Take]) -> list[float]:
        if not takes:
            return []
        keys, args = self._args("take", takes)
        return [float(w) / 1000 for w in self._script(keys=keys, args=args)]

    @wrap_errors("spending from a budget")
    def spend(self, take: Take) -> None:
        keys, args = self._args("spend", [take])
        self._script(keys=keys, args=args)

    @wrap_errors("reading a budget's usage")
    def usage(self, name: str, per: float, limit: int) -> BudgetUsage:
        """The budget's keys found by SCAN (at most :data:`MAX_USAGE_KEYS`), their windows summed by the script."""
        base = f"{self.namespace}:budget:"
        keys: list[str] = []
        capped = False
        for pattern in (_glob(base + name), _glob(base + key_prefix(name)) + "*"):
            for raw in self.client.scan_iter(match=pattern, count=1000):
                if len(keys) >= MAX_USAGE_KEYS:
                    capped = True
                    break
                keys.append(raw.decode() if isinstance(raw, bytes) else raw)
        found: list[KeyUsage] = []
        for start in range(0, len(keys), _USAGE_BATCH):
            batch = keys[start : start + _USAGE_BATCH]
            sums = self._script(keys=batch, args=["usage", "", per * 1000])
            found += [KeyUsage(k[len(base) :], float(u)) for k, u in zip(batch, sums) if float(u) > 0]
        found.sort(key=lambda k: (-k.used, k.key))
        return BudgetUsage(found[: max(0, limit)], len(found), capped)

    def close(self) -> None:
        self.client.close()


#: Keys summed per script call by :meth:`RedisBudgets.usage`.
_USAGE_BATCH = 500


def _glob(text: str) -> str:
    """``text`` matched literally by SCAN's MATCH (its glob characters escaped)."""
    return "".join("\\" + c if c in "*?[]\\" else c for c in text)
