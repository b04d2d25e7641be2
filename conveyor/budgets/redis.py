"""Budgets on Redis (redis broker): one sorted set per budget key, checked and written by one Lua script."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Sequence

import redis

from conveyor.budgets.base import BudgetStore, Take
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

    def close(self) -> None:
        self.client.close()
