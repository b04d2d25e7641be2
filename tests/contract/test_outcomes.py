"""A started delivery's outcomes: ack completes, a retry runs again after its delay, a final failure is dead."""

from __future__ import annotations

import time

import pytest

from tests.contract.drive import enqueue, fail, record_in, retry


@pytest.mark.topology
def test_an_ack_completes_the_job(broker, pump):
    ref = enqueue(broker, {"n": 1})
    consumer = pump(broker)
    delivered = consumer.receive()
    broker.start_job(delivered)
    consumer.ack(delivered)
    record = record_in(broker, ref.id, "completed")
    assert (record.attempts, record.error) == (1, None)
    assert record.finished_at is not None and record.finished_at >= record.started_at
    counts = broker.queue_counts("contract")
    assert (counts.waiting, counts.active, counts.failed, counts.completed_total, counts.failed_total) == (
        0,
        0,
        0,
        1,
        0,
    )
    assert [r.id for r in broker.list_jobs("contract", "completed")] == [ref.id]
    consumer.nothing(within=0.2)


@pytest.mark.topology
def test_a_retry_runs_again_after_its_delay_and_keeps_the_error(broker, pump):
    ref = enqueue(broker, {"n": 1})
    consumer = pump(broker)
    first = consumer.receive()
    assert broker.start_job(first) == 1
    failed_at, wall = time.monotonic(), time.time()
    retry(broker, consumer, first, "ValueError: try again", delay_ms=500)
    record = record_in(broker, ref.id, "delayed")
    assert (record.attempts, record.error) == (1, "ValueError: try again")
    assert record.eta is not None and record.eta >= wall + 0.45
    consumer.nothing(until=failed_at + 0.4)
    second = consumer.receive()
    assert time.monotonic() - failed_at >= 0.45, "redelivered before its delay was over"
    assert second.message_id == ref.id and second.args[0] == {"n": 1}
    assert broker.get_job(ref.id).error == "ValueError: try again", "the error stays until the job completes"
    assert broker.start_job(second) == 2
    consumer.ack(second)
    record = record_in(broker, ref.id, "completed")
    assert (record.attempts, record.error) == (2, None)
    assert broker.queue_counts("contract").completed_total == 1


def test_a_retry_without_delay_is_waiting_at_once(broker, pump):
    ref = enqueue(broker, {"n": 1})
    consumer = pump(broker)
    first = consumer.receive()
    broker.pause_queue("contract")  # the retry must wait to be read, not be claimed at once
    broker.start_job(first)
    broker.enqueue(first.copy(options={"last_error": "Busy"}))
    consumer.ack(first)
    record = record_in(broker, ref.id, "waiting")
    assert (record.attempts, record.error) == (1, "Busy")
    broker.resume_queue("contract")
    assert consumer.receive().message_id == ref.id


@pytest.mark.topology
def test_a_final_failure_is_dead_with_its_error_and_its_claim_is_won(broker, pump):
    ref = enqueue(broker, {"n": 1})
    consumer = pump(broker)
    delivered = consumer.receive()
    broker.start_job(delivered)
    assert fail(broker, consumer, delivered, "RuntimeError: broken for good") is True
    record = record_in(broker, ref.id, "failed")
    assert (record.attempts, record.error) == (1, "RuntimeError: broken for good")
    assert record.finished_at is not None
    counts = broker.queue_counts("contract")
    assert (counts.waiting, counts.active, counts.failed, counts.failed_total, counts.completed_total) == (
        0,
        0,
        1,
        1,
        0,
    )
    assert [r.id for r in broker.list_jobs("contract", "failed")] == [ref.id]
    consumer.nothing(within=0.2)


def test_a_retried_failed_job_runs_again_and_can_win_its_claim_again(broker, pump):
    ref = enqueue(broker, {"n": 1})
    consumer = pump(broker)
    delivered = consumer.receive()
    broker.start_job(delivered)
    fail(broker, consumer, delivered, "RuntimeError: first")
    record_in(broker, ref.id, "failed")
    broker.pause_queue("contract")  # read the retried job before it is claimed again
    assert broker.retry_job(ref.id)
    record = broker.get_job(ref.id)
    assert (record.state, record.attempts, record.error) == ("waiting", 0, "RuntimeError: first")
    assert not broker.retry_job(ref.id), "only a failed job can be retried"
    broker.resume_queue("contract")
    again = consumer.receive()
    assert broker.start_job(again) == 1, "a retried job gets a fresh attempt budget"
    assert fail(broker, consumer, again, "RuntimeError: second") is True, "its final-failure claim was released"
    record = record_in(broker, ref.id, "failed")
    assert record.error == "RuntimeError: second"
    assert broker.queue_counts("contract").failed_total == 2
