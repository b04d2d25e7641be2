"""Starting a delivery: it counts an attempt, and only the job's current delivery may start or settle it."""

from __future__ import annotations

import time

import pytest

from tests.contract.drive import enqueue, record_in


@pytest.mark.topology
def test_a_start_counts_an_attempt_and_makes_the_job_active(broker, pump):
    ref = enqueue(broker, {"n": 1})
    consumer = pump(broker)
    delivered = consumer.receive()
    assert delivered.message_id == ref.id and delivered.args[0] == {"n": 1}
    before = time.time()
    assert broker.start_job(delivered) == 1
    record = broker.get_job(ref.id)
    assert (record.state, record.attempts) == ("active", 1)
    assert before - 1 <= record.started_at <= time.time() + 1
    counts = broker.queue_counts("contract")
    assert (counts.waiting, counts.active) == (0, 1)
    assert [r.id for r in broker.list_jobs("contract", "active")] == [ref.id]
    assert not broker.delete_job(ref.id), "a running job cannot be deleted"
    assert broker.get_job(ref.id).state == "active"


def test_a_deleted_waiting_job_does_not_start(broker, pump):
    ref = enqueue(broker, {"n": 1})
    broker.pause_queue("contract")
    consumer = pump(broker)
    assert broker.delete_job(ref.id)
    assert broker.get_job(ref.id) is None
    broker.resume_queue("contract")
    # A broker may still hand out the deleted job's message (inline keeps it in memory): it must not start.
    delivered = consumer.poll(timeout=0.3)
    if delivered is not None:
        assert delivered.message_id == ref.id
        assert broker.start_job(delivered) == 0
    assert broker.get_job(ref.id) is None


@pytest.mark.topology
@pytest.mark.needs("fence")
def test_a_handed_back_delivery_can_neither_start_nor_settle_the_next_one(broker, pump):
    ref = enqueue(broker, {"n": 1})
    consumer = pump(broker)
    first = consumer.receive()
    assert broker.start_job(first) == 1
    assert broker.start_job(first) == 1, "a start repeated (its reply was lost) counts no second attempt"
    consumer.requeue([first])  # handed back: the job is given out again as a new delivery
    second = consumer.receive()
    assert second.message_id == ref.id
    assert broker.start_job(first) == 0, "a superseded delivery must not start"
    assert broker.start_job(second) == 2
    consumer.ack(first)
    assert broker.claim_final_failure(first) is False, "a superseded delivery must not claim the final failure"
    time.sleep(0.2)  # room for the stale ack to land, if the broker (wrongly) takes it
    record = broker.get_job(ref.id)
    assert (record.state, record.attempts) == ("active", 2), "the stale ack must not end the current delivery"
    consumer.ack(second)
    assert record_in(broker, ref.id, "completed").attempts == 2
    assert broker.queue_counts("contract").completed_total == 1
