"""A budget store's usage read (the Budgets page): each key's weight in its window now, on every store."""

from __future__ import annotations

import time

import pytest

from conveyor.budgets.base import Take

#: The Redis namespace of these stores: SCAN's glob characters in it must match only themselves.
NAMESPACE = "dash[1]*?"


@pytest.fixture(params=["memory", "redis", "postgres", "redis-cluster"])
def store(request):
    if request.param == "memory":
        from conveyor.budgets.memory import MemoryBudgets

        yield MemoryBudgets()
        return
    if request.param == "postgres":
        from psycopg_pool import ConnectionPool

        from conveyor.budgets.postgres import PostgresBudgets

        with ConnectionPool(request.getfixturevalue("database_url"), min_size=1, max_size=2, open=True) as pool:
            yield PostgresBudgets(pool)
        return
    from conveyor.brokers.redis.keys import shared_namespace
    from conveyor.budgets.redis import RedisBudgets
    from conveyor.redis_client import client, is_cluster
    from conveyor.settings import Settings

    url = request.getfixturevalue("redis_url" if request.param == "redis" else "redis_cluster_url")
    redis_client = client(url, Settings(broker="redis", redis_url=url))
    budgets = RedisBudgets(redis_client, shared_namespace(NAMESPACE, cluster=is_cluster(redis_client)))
    # A key of the same budget under another namespace: not this store's.
    redis_client.zadd("other:budget:tokens:x", {"5|a": time.time() * 1000})
    yield budgets
    budgets.close()


def test_usage_sums_each_keys_window_most_used_first_and_only_its_own_budgets_keys(store):
    for key, weight in [("tokens:a", 3), ("tokens:b", 7), ("tokens:a", 2), ("tokens:c*", 1)]:
        assert store.take([Take(key, 100, 60, weight)]) == [0.0]
    store.take([Take("tokens", 100, 60, 4)])  # the same name without a key: its own window
    store.take([Take("tokensmore:a", 100, 60, 50)])  # another budget whose name starts alike
    store.spend(Take("tokens:b", 100, 60, 1.5))

    usage = store.usage("tokens", 60, 10)
    assert [(k.key, k.used) for k in usage.keys] == [
        ("tokens:b", 8.5),
        ("tokens:a", 5.0),
        ("tokens", 4.0),
        ("tokens:c*", 1.0),
    ]
    assert (usage.total, usage.capped) == (4, False)
    top = store.usage("tokens", 60, 2)
    assert [k.key for k in top.keys] == ["tokens:b", "tokens:a"] and top.total == 4
    assert store.usage("absent", 60, 10).keys == []


def test_usage_counts_only_the_window(store):
    store.take([Take("short:a", 100, 0.5, 3)])
    assert [k.used for k in store.usage("short", 0.5, 10).keys] == [3.0]
    time.sleep(0.7)
    assert store.usage("short", 0.5, 10).total == 0
