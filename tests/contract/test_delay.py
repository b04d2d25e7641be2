"""Delayed jobs: never handed out before their delay is over, handed out once it is."""

from __future__ import annotations

import time

import pytest

from tests.contract.drive import QUEUE, enqueue, record_in


@pytest.mark.topology
def test_a_delayed_job_is_delivered_after_its_delay_not_before(broker, pump):
    consumer = pump(broker)
    enqueued, wall = time.monotonic(), time.time()
    ref = enqueue(broker, {"n": 1}, delay_ms=500)
    record = broker.get_job(ref.id)
    assert (record.state, record.attempts) == ("delayed", 0)
    assert record.eta is not None and wall + 0.45 <= record.eta <= time.time() + 0.55
    counts = broker.queue_counts(QUEUE)
    assert (counts.waiting, counts.delayed) == (0, 1)
    assert [r.id for r in broker.list_jobs(QUEUE, "delayed")] == [ref.id]
    consumer.nothing(until=enqueued + 0.4)
    delivered = consumer.receive()
    assert time.monotonic() - enqueued >= 0.45, "delivered before its delay was over"
    assert delivered.message_id == ref.id and delivered.args[0] == {"n": 1}
    assert broker.start_job(delivered) == 1
    assert broker.get_job(ref.id).state == "active"
    assert broker.queue_counts(QUEUE).delayed == 0


def test_a_job_without_delay_overtakes_a_delayed_one(broker, pump):
    later = enqueue(broker, {"n": 1}, delay_ms=300)
    now = enqueue(broker, {"n": 2})
    consumer = pump(broker)
    first = consumer.receive()
    assert first.message_id == now.id
    broker.start_job(first)
    consumer.ack(first)
    assert consumer.receive().message_id == later.id


def test_a_deleted_delayed_job_is_never_delivered(broker, pump):
    consumer = pump(broker)
    ref = enqueue(broker, {"n": 1}, delay_ms=300)
    time.sleep(0.1)  # a broker with delay queues has handed it to the pump, which holds it until it is due
    assert broker.delete_job(ref.id)
    delivered = consumer.poll(timeout=0.5)
    if delivered is not None:  # handed out anyway: it must not start
        assert delivered.message_id == ref.id
        assert broker.start_job(delivered) == 0
    assert broker.get_job(ref.id) is None
    assert broker.queue_counts(QUEUE).delayed == 0


@pytest.mark.topology
def test_a_delayed_retry_waits_in_the_delayed_state(broker, pump):
    ref = enqueue(broker, {"n": 1})
    consumer = pump(broker)
    delivered = consumer.receive()
    broker.start_job(delivered)
    retried, wall = time.monotonic(), time.time()
    broker.enqueue(delivered.copy(options={"last_error": "Later"}), delay=500)
    consumer.ack(delivered)
    record = record_in(broker, ref.id, "delayed")
    assert record.error == "Later" and record.eta >= wall + 0.45
    counts = broker.queue_counts(QUEUE)
    assert (counts.active, counts.delayed, counts.waiting) == (0, 1, 0)
    consumer.nothing(until=retried + 0.4)
    assert consumer.receive().message_id == ref.id
    assert time.monotonic() - retried >= 0.45, "delivered before its delay was over"
