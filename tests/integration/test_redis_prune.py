"""The Redis maintenance pass prunes the finished-job indexes in batches, off the hot path."""

from __future__ import annotations

import redis

from conveyor.app import App
from tests.support.harness import make_settings

GOOD = {"user_id": "u1", "task_id": "t1", "message_id": "m1", "total_tokens": 10}

#: The script's PRUNE_BATCH (conveyor/brokers/redis/jobs.lua).
BATCH = 20000


def test_a_maintenance_pass_prunes_a_batch_of_the_oldest_index_entries_and_keeps_young_ones(
    clean_env, redis_url, database_url
):
    app = App(make_settings("redis", redis_url, database_url, retention=3600))
    try:
        ref = app.jobs.enqueue("credit.consume", GOOD)  # declares the queue this broker maintains
        client = redis.Redis.from_url(redis_url, decode_responses=True)
        (record,) = [k for k in client.keys(f"*job:{ref.id}") if k.endswith(ref.id)]
        queue = client.hget(record, "queue")
        index = f"{app.settings.redis_namespace}:idx:{queue}:completed"
        seconds, micros = client.time()
        now_ms = seconds * 1000 + micros // 1000
        old = BATCH + BATCH // 2
        client.zadd(index, {f"old-{i}": now_ms - 7_200_000 - i for i in range(old)})
        client.zadd(index, {"young": now_ms})

        app.broker.maintain()  # one batch, the oldest first: one Redis call never takes them all
        assert client.zcard(index) == old - BATCH + 1
        assert client.zscore(index, f"old-{old - 1}") is None, "the oldest entries go first"
        app.broker.maintain()
        assert client.zrange(index, 0, -1) == ["young"]
    finally:
        app.close()
