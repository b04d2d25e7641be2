"""What a caller sees at enqueue time: clear errors, nothing half-enqueued."""

from __future__ import annotations

import pytest

from conveyor.app import App
from conveyor.errors import BrokerUnavailable, InvalidPayload, PayloadTooLarge, UnknownJob
from conveyor.tasks.jobqueue import JobRequest
from tests.support.brokers import ALL_BROKERS, SERVER_BROKERS
from tests.support.harness import make_settings

GOOD = {"user_id": "u1", "task_id": "t1", "message_id": "m1", "total_tokens": 10}


#: Validation runs before any broker, so Redis and the in-process broker cover it; Postgres is left
#: out as it always was here (its own enqueue paths: test_pg_broker.py).
ENQUEUE_BROKERS = tuple(b for b in ALL_BROKERS if b != "postgres")


@pytest.fixture(params=ENQUEUE_BROKERS)
def app(request, clean_env, redis_url, database_url):
    app = App(make_settings(request.param, redis_url, database_url, max_payload_bytes=2048))
    yield app
    app.close()


def nothing_enqueued(app):
    counts = app.broker.queue_counts("critical")
    return counts.waiting == counts.delayed == counts.active == 0


@pytest.mark.parametrize(
    "payload, field",
    [
        ({**GOOD, "total_tokens": "many"}, "total_tokens"),
        ({k: v for k, v in GOOD.items() if k != "task_id"}, "task_id"),
        ({**GOOD, "user_id": ""}, "user_id"),
        ({**GOOD, "user_id": "has space"}, "user_id"),
        ({**GOOD, "extra": 1}, "extra"),
        ("not json", "<payload>"),
    ],
)
def test_invalid_payload_names_job_and_field_and_enqueues_nothing(app, payload, field):
    with pytest.raises(InvalidPayload) as info:
        app.jobs.enqueue("credit.consume", payload)
    assert "credit.consume" in str(info.value) and field in str(info.value)
    assert nothing_enqueued(app)


def test_invalid_payload_error_never_echoes_the_value(app):
    with pytest.raises(InvalidPayload) as info:
        app.jobs.enqueue("test.probe.critical", {"token": "x", "api_key": {"sk-live-secret": 1}})
    assert "sk-live-secret" not in str(info.value)


def test_unknown_job_lists_the_known_ones(app):
    with pytest.raises(UnknownJob) as info:
        app.jobs.enqueue("credit.consum", GOOD)
    assert "credit.consum" in str(info.value) and "credit.consume" in str(info.value)


def test_oversize_payload_is_refused(app):
    with pytest.raises(PayloadTooLarge, match="CONVEYOR_MAX_PAYLOAD_BYTES"):
        app.jobs.enqueue("test.probe.critical", {"token": "x" * 5000})
    assert nothing_enqueued(app)


def test_one_bad_item_in_a_batch_enqueues_none_of_it(app):
    with pytest.raises(InvalidPayload):
        app.jobs.enqueue_many(
            [
                {"job": "credit.consume", "payload": GOOD},
                {"job": "credit.consume", "payload": {**GOOD, "total_tokens": -1}},
            ]
        )
    assert nothing_enqueued(app)


#: The server each broker with one keeps its queue on (the fixture that starts it).
SERVER_OF = {"redis": "redis_server", "postgres": "pg_server"}


@pytest.mark.parametrize("broker", SERVER_BROKERS)
def test_a_broker_down_gives_a_clear_error_and_reserves_no_key(broker, request, clean_env, redis_url, database_url):
    """The same promise on every broker with a server (it was one test in test_pg_broker.py, one here for Redis)."""
    server = request.getfixturevalue(SERVER_OF[broker])
    app = App(make_settings(broker, redis_url, database_url))
    try:
        server.stop()
        try:
            with pytest.raises(BrokerUnavailable, match="nothing was enqueued"):
                app.jobs.enqueue("test.probe.critical", {"token": "down"}, key="down:1")
        finally:
            server.start()
        ref = app.jobs.enqueue("test.probe.critical", {"token": "down"}, key="down:1")
        assert not ref.deduplicated, "the failed enqueue must not have reserved the key"
        assert app.broker.queue_counts("critical").waiting == 1
    finally:
        app.close()


def test_key_whose_job_vanished_is_free_again(clean_env, redis_url, database_url):
    """A key left behind without its job (a crash, a deleted record) never blocks a new enqueue."""
    import redis

    app = App(make_settings("redis", redis_url, database_url))
    try:
        client = redis.Redis.from_url(redis_url)
        client.set("conveyor:dedup:credit:t9:m9", "a-job-that-never-was")
        ref = app.jobs.enqueue("credit.consume", GOOD, key="credit:t9:m9")
        assert not ref.deduplicated and ref.id != "a-job-that-never-was"
    finally:
        app.close()


def test_undecodable_message_is_dead_lettered_alone(clean_env, redis_url, database_url):
    import redis

    from tests.support.harness import running
    from tests.support.waiting import wait_for

    app = App(make_settings("redis", redis_url, database_url))
    try:
        client = redis.Redis.from_url(redis_url)
        client.hset("conveyor:critical.msgs", "garbage-1", b"\x00not json at all")
        client.rpush("conveyor:critical", "garbage-1")
        with running(app, "critical"):
            good = app.jobs.enqueue("test.probe.critical", {"token": "after-garbage"})
            wait_for(lambda: app.broker.get_job(good.id).state == "completed")
        assert client.zscore("conveyor:critical.XQ", "garbage-1") is not None
        assert app.broker.queue_counts("critical").failed_total == 1
    finally:
        app.close()


@pytest.mark.parametrize("priority", [-1, 10, 2.5, "5", True, "sk-live-secret"])
def test_a_priority_out_of_range_is_refused_without_echoing_it(app, priority):
    with pytest.raises(InvalidPayload) as info:
        app.jobs.enqueue("credit.consume", GOOD, priority=priority)
    assert "priority" in str(info.value) and "0-9" in str(info.value)
    assert "sk-live-secret" not in str(info.value)
    assert nothing_enqueued(app)


def test_a_job_handle_and_a_batch_carry_the_priority(app):
    from conveyor.brokers.base import priority_of

    ref = app.jobs.enqueue("credit.consume", GOOD, priority=7)
    (batched,) = app.jobs.enqueue_many(
        [{"job": "credit.consume", "payload": {**GOOD, "message_id": "m2"}, "priority": 3}]
    )
    assert app.broker.queue_counts("critical").waiting == 2
    items = [
        app.jobs.prepare(r)
        for r in (JobRequest("credit.consume", GOOD, priority=9), JobRequest("credit.consume", GOOD))
    ]
    assert [priority_of(i.message) for i in items] == [9, 0]
    assert "broker_priority" not in items[1].message.options, "a plain job's message is as before"
    assert ref.id and batched.id
