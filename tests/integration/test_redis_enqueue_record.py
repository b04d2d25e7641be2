"""The Redis enqueue writes a job's record in one HSET: what a re-enqueue of the same job keeps and drops."""

from __future__ import annotations

import redis
from dramatiq import Message

from conveyor.app import App
from tests.support.harness import make_settings

GOOD = {"user_id": "u1", "task_id": "t1", "message_id": "m1", "total_tokens": 10}


def test_a_reenqueue_of_the_same_job_keeps_its_counts_and_leaves_its_old_group(clean_env, redis_url, database_url):
    app = App(make_settings("redis", redis_url, database_url))
    try:
        ref = app.jobs.enqueue("credit.consume", GOOD, key="k:1", group="tenant-a")
        client = redis.Redis.from_url(redis_url, decode_responses=True)
        (record,) = [k for k in client.keys(f"*job:{ref.id}") if k.endswith(ref.id)]
        first = client.hgetall(record)
        assert first["key"] == "k:1" and first["group"] == "tenant-a" and first["attempts"] == "0"
        assert first["delivery"] == "0" and first["enqueued_at"] and "error" not in first
        client.hset(record, mapping={"attempts": 2, "delivery": 3, "enqueued_at": 1})

        # The same job id again, now in the default group and with an error, as a plain Dramatiq enqueue.
        again = Message(
            queue_name=first["queue"],
            actor_name="credit.consume",
            args=(GOOD,),
            kwargs={},
            options={"last_error": "boom"},
            message_id=ref.id,
        )
        app.broker.enqueue(again)
        after = client.hgetall(record)
        assert (after["attempts"], after["delivery"], after["enqueued_at"]) == ("2", "3", "1")
        assert "group" not in after and after["error"] == "boom" and after["rid"] != first["rid"]
        assert after["state"] == "waiting" and client.ttl(record) == -1
    finally:
        app.close()
