"""The Redis broker's priority levels leave nothing behind: every way out of a level empties its keys."""

from __future__ import annotations

import time

import redis

from conveyor.app import App
from tests.support.harness import make_settings

GOOD = {"user_id": "u1", "task_id": "t1", "message_id": "m1", "total_tokens": 10}


def _fetch_ids(consumer, count: int, *, ack: bool = False) -> list[str]:
    """The ids of the next ``count`` messages the consumer hands out, in order (10 s at most)."""
    got: list[str] = []
    deadline = time.monotonic() + 10
    while len(got) < count and time.monotonic() < deadline:
        message = next(consumer)
        if message is not None:
            got.append(message.message_id)
            if ack:
                consumer.ack(message)
    return got


def test_levels_and_their_ranks_are_emptied_by_fetch_delete_and_cancel(clean_env, redis_url, database_url):
    app = App(make_settings("redis", redis_url, database_url))
    try:
        refs = [app.jobs.enqueue("credit.consume", {**GOOD, "message_id": str(p)}, priority=p) for p in (0, 3, 3, 7)]
        client = redis.Redis.from_url(redis_url)
        level_keys = [k for k in client.keys("*critical.*") if b".p" in k or k.endswith((b".ranks", b".levels"))]
        assert level_keys, "levels above 0 are in use"
        assert app.broker.delete_job(refs[1].id)
        assert app.broker.cancel_job(refs[2].id) == "cancelled"
        consumer = app.broker.consume("critical", prefetch=4, timeout=100)
        assert _fetch_ids(consumer, 2) == [refs[3].id, refs[0].id]
        next(consumer)  # one more fetch finds the emptied levels and forgets them
        assert [k for k in level_keys if client.exists(k)] == []
        consumer.close()
    finally:
        app.close()


def test_flushing_a_queue_empties_its_levels_too(clean_env, redis_url, database_url):
    app = App(make_settings("redis", redis_url, database_url))
    try:
        app.jobs.enqueue("credit.consume", GOOD, priority=5)
        client = redis.Redis.from_url(redis_url)
        assert client.keys("*critical.p5")
        app.broker.flush("critical")
        assert client.keys("*critical.p*") == [] and client.keys("*critical.ranks") == []
    finally:
        app.close()


def test_a_plain_dramatiq_producers_message_ranks_by_its_timestamp_not_first(clean_env, redis_url, database_url):
    """A message no conveyor enqueue wrote (an older producer, or Dramatiq's own ``send``) has no record
    and no ready time: it ranks by the time its producer stamped on it, so priorities still order it."""
    import dramatiq
    from dramatiq.brokers.redis import RedisBroker as PlainRedisBroker

    settings = make_settings("redis", redis_url, database_url)
    app = App(settings)
    plain = PlainRedisBroker(url=redis_url, namespace=settings.redis_namespace)
    try:
        urgent = app.jobs.enqueue("credit.consume", {**GOOD, "message_id": "urgent"}, priority=5)
        sent = plain.enqueue(
            dramatiq.Message(
                queue_name="critical",
                actor_name="credit.consume",
                args=({**GOOD, "message_id": "plain"},),
                kwargs={},
                options={},
            )
        )
        consumer = app.broker.consume("critical", prefetch=1, timeout=100)
        assert _fetch_ids(consumer, 2, ack=True) == [urgent.id, sent.message_id]
        consumer.close()
    finally:
        plain.close()
        app.close()
