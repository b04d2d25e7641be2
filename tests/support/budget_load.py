"""A process that hammers one budget from several threads (tests/integration/test_budget_stores.py)."""

from __future__ import annotations

import random
import threading
import time

from conveyor.budgets.base import BudgetStore, Take


def open_store(store: str, url: str, namespace: str = "conveyor") -> BudgetStore:
    if store == "redis":
        import redis

        from conveyor.budgets.redis import RedisBudgets

        return RedisBudgets(redis.Redis.from_url(url), namespace)
    from conveyor.budgets.postgres import PostgresBudgets
    from conveyor.db import open_pool

    return PostgresBudgets(open_pool(url, max_size=8, name="budget-load"))


def hammer(store_name: str, url: str, key: str, limit: float, per: float, max_weight: int, seconds: float) -> None:
    """Four threads ask for random weights (1..max_weight) as fast as they can for ``seconds``."""
    store = open_store(store_name, url)
    end = time.monotonic() + seconds

    def ask(seed: int) -> None:
        rng = random.Random(seed)
        while time.monotonic() < end:
            store.take([Take(key, limit, per, rng.randint(1, max_weight))])

    threads = [threading.Thread(target=ask, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
