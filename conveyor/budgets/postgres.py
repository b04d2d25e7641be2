"""Budgets on Postgres (postgres broker, embedded default): rows in ``conveyor_budget_entries``.

One statement per admission: ``conveyor_budget_take`` (migration 0065) takes a
transaction-level advisory lock per budget key (in key order, so two callers
never deadlock), reads the clock after the locks, drops expired rows, checks and
inserts. The locks end with the statement's transaction, so a pooler in
transaction mode is fine and a worker that dies holds nothing.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence

from conveyor.budgets.base import BudgetStore, BudgetUsage, KeyUsage, Take, key_prefix
from conveyor.db import load_queries

if TYPE_CHECKING:
    from psycopg_pool import ConnectionPool

QUERIES = load_queries(Path(__file__).with_name("postgres.sql"))


class PostgresBudgets(BudgetStore):
    """Sliding-window logs in a table, on the database's clock."""

    def __init__(self, pool: ConnectionPool[Any]) -> None:
        self.pool = pool

    def _params(self, takes: Sequence[Take]) -> dict[str, list[Any]]:
        return {
            "keys": [t.key for t in takes],
            "limits": [float(t.limit) for t in takes],
            "pers": [float(t.per) for t in takes],
            "weights": [float(t.weight) for t in takes],
        }

    def take(self, takes: Sequence[Take]) -> list[float]:
        if not takes:
            return []
        with self.pool.connection() as conn:
            row = conn.execute(QUERIES["take"], self._params(takes)).fetchone()
        assert row is not None, "a SELECT of a function has its row"
        return [float(w) for w in row[0]]

    def spend(self, take: Take) -> None:
        with self.pool.connection() as conn:
            conn.execute(QUERIES["spend"], self._params([take]))

    def usage(self, name: str, per: float, limit: int) -> BudgetUsage:
        params = {"name": name, "prefix": key_prefix(name), "per": float(per), "limit": max(1, limit)}
        with self.pool.connection() as conn:
            rows = conn.execute(QUERIES["usage"], params).fetchall()
        keys = [KeyUsage(key, float(used)) for key, used, _ in rows]
        return BudgetUsage(keys[: max(0, limit)], int(rows[0][2]) if rows else 0)

    def close(self) -> None:
        """The App's pool is the App's to close."""
