"""Upgrading the Redis broker: a named group's jobs left in the FIFO list of an earlier release still run.

Earlier releases kept a named group's ready rids in a list (``Keys.group``); jobs.lua now keeps them in a
sorted set by rank (``Keys.group_ready``) and drains such a list first, where it finds one. The test makes
that layout from jobs enqueued now (the set's rids moved to the list, the rank fields an earlier release
did not write taken off their records), on one Redis and on a cluster (every key in the queue's slot).
"""

from __future__ import annotations

from typing import Any

import pytest
import redis

from conveyor.brokers.base import PRIORITY, CancelOutcome, EnqueueItem
from conveyor.settings import Settings
from tests.contract.conftest import LEASE
from tests.contract.drive import JOB, LONG_TTL, QUEUE, Pump, drain


def _grouped(n: int, group: str, priority: int = 0) -> EnqueueItem:
    from dramatiq import Message

    options: dict[str, Any] = {"group": group, PRIORITY: priority}
    return EnqueueItem(Message(queue_name=QUEUE, actor_name=JOB, args=({"n": n},), kwargs={}, options=options))


@pytest.fixture(params=["redis", "redis-cluster"])
def broker(request: pytest.FixtureRequest, clean_env: pytest.MonkeyPatch) -> Any:
    import dramatiq

    from conveyor.brokers.redis import RedisBroker

    url = request.getfixturevalue("redis_url" if request.param == "redis" else "redis_cluster_url")
    settings = Settings(broker="redis", redis_url=url, heartbeat_timeout=LEASE, maintenance_interval=0.1)
    made = RedisBroker(
        url=url, middleware=[], namespace="upgrade", heartbeat_timeout=LEASE, retention=3600, settings=settings
    )
    dramatiq.actor(lambda payload: None, broker=made, actor_name=JOB, queue_name=QUEUE)
    yield made
    made.close()


def _to_old_list(broker: Any, group: str, refs: list[Any]) -> None:
    """Move the group's ready set into the list an earlier release kept, FIFO: in the order of ``refs``."""
    keys = broker.keys.scope(QUEUE)
    client = broker.client
    rids = [client.hget(keys.job(ref.id), "rid") for ref in refs]
    assert client.zcard(keys.group_ready(QUEUE, group)) == len(rids)
    client.delete(keys.group_ready(QUEUE, group))
    client.rpush(keys.group(QUEUE, group), *rids)
    for ref in refs:
        client.hdel(keys.job(ref.id), "grank", "lead", "ready_at")


@pytest.fixture
def pumps() -> Any:
    made: list[Pump] = []
    yield made
    for p in made:
        p.close()


def test_jobs_left_in_an_old_group_list_run_first_then_the_group_by_rank(broker, pumps):
    client: redis.Redis = broker.client
    keys = broker.keys.scope(QUEUE)
    refs = broker.enqueue_jobs([_grouped(0, "a"), _grouped(1, "a", 9), _grouped(2, "a")], dedup_ttl=LONG_TTL)
    _to_old_list(broker, "a", refs)  # FIFO there: an earlier release did not order a group by priority
    assert client.lrange(keys.groups(QUEUE), 0, -1) == [b"", b"a"]
    # Enqueued by the new release while the old list still waits: the group is in the ring once.
    broker.enqueue_jobs([_grouped(3, "a"), _grouped(4, "a", 9)], dedup_ttl=LONG_TTL)
    assert client.lrange(keys.groups(QUEUE), 0, -1) == [b"", b"a"]
    (counts,) = broker.group_counts(QUEUE).groups
    assert counts.waiting == 5 and counts.oldest_waiting_at is not None
    p = Pump(broker, QUEUE, prefetch=1)
    pumps.append(p)
    # The old list's jobs first, in its order; then the set's by rank (priority 9 first).
    assert drain(broker, p, 5) == [0, 1, 2, 4, 3]
    assert not client.exists(keys.group(QUEUE, "a"), keys.group_ready(QUEUE, "a"), keys.groups(QUEUE))


def test_a_job_of_an_old_list_handed_back_or_cancelled_leaves_nothing_behind(broker, pumps):
    client: redis.Redis = broker.client
    keys = broker.keys.scope(QUEUE)
    refs = broker.enqueue_jobs([_grouped(n, "a") for n in range(3)], dedup_ttl=LONG_TTL)
    _to_old_list(broker, "a", refs)
    assert broker.cancel_job(refs[2].id) == CancelOutcome.CANCELLED
    assert client.llen(keys.group(QUEUE, "a")) == 2, "a cancel takes its job out of the old list"
    p = Pump(broker, QUEUE, prefetch=1)
    pumps.append(p)
    taken = p.receive()
    assert taken.args[0]["n"] == 0
    p.requeue([taken])  # no rank kept on its record: back to the front of the old list
    assert drain(broker, p, 2) == [0, 1]
    p.nothing(within=0.5)
    assert not client.exists(keys.group(QUEUE, "a"), keys.group_ready(QUEUE, "a"), keys.groups(QUEUE))
