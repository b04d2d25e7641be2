"""Promoting a delayed job: it runs now, once, wherever its delay kept it."""

from __future__ import annotations

import time

import pytest

from tests.contract.drive import QUEUE, enqueue, record_in

HOUR_MS = 3_600_000


def _runs_once(broker, consumer, job_id: str) -> None:
    delivered = consumer.receive(timeout=10)
    assert delivered.message_id == job_id and delivered.args[0] == {"n": 1}
    assert delivered.options.get("eta") is None, "promoted, yet still carrying its delay"
    assert broker.start_job(delivered) == 1
    consumer.ack(delivered)
    record_in(broker, job_id, "completed")
    consumer.nothing(within=1.0)  # the copy its delay kept never comes back
    assert broker.get_job(job_id).state == "completed"


@pytest.mark.topology
def test_a_promoted_delayed_job_runs_now_and_once(broker, pump):
    ref = enqueue(broker, {"n": 1}, delay_ms=HOUR_MS)
    assert broker.get_job(ref.id).state == "delayed"
    assert broker.promote_job(ref.id)
    record = broker.get_job(ref.id)
    assert (record.state, record.eta) == ("waiting", None)
    counts = broker.queue_counts(QUEUE)
    assert (counts.waiting, counts.delayed) == (1, 0)
    assert not broker.promote_job(ref.id), "a waiting job is not delayed: promoting it again changes nothing"
    consumer = pump(broker)
    _runs_once(broker, consumer, ref.id)


def test_a_delayed_job_a_worker_holds_until_its_eta_runs_now_and_once(broker, pump):
    consumer = pump(broker)
    ref = enqueue(broker, {"n": 1}, delay_ms=HOUR_MS)
    time.sleep(0.5)  # a broker with delay queues has handed it to the pump, which holds it for an hour
    started = time.monotonic()
    assert broker.promote_job(ref.id)
    _runs_once(broker, consumer, ref.id)
    assert time.monotonic() - started < 10


@pytest.mark.topology
def test_the_holders_own_promotion_at_the_eta_is_refused(broker, pump):
    consumer = pump(broker)
    ref = enqueue(broker, {"n": 1}, delay_ms=1500)
    time.sleep(0.5)  # held by the pump until its eta, a second from now
    broker.pause_queue(QUEUE)  # nobody fetches the promoted message before the holder's eta
    time.sleep(0.3)  # (inline: a consumer already waiting on its queue takes one more)
    assert broker.promote_job(ref.id)
    time.sleep(1.5)  # the eta passed: the holder promoted its copy, and must have been refused
    consumer.nothing(within=0.2)
    broker.resume_queue(QUEUE)
    _runs_once(broker, consumer, ref.id)
    record = broker.get_job(ref.id)
    assert (record.state, record.attempts) == ("completed", 1)
    assert broker.queue_counts(QUEUE).waiting == 0


def test_only_delayed_jobs_are_promoted(broker, pump):
    assert not broker.promote_job("no-such-job")
    ref = enqueue(broker, {"n": 1})
    assert not broker.promote_job(ref.id)
    consumer = pump(broker)
    delivered = consumer.receive()
    broker.start_job(delivered)
    assert not broker.promote_job(ref.id)
    consumer.ack(delivered)
    record_in(broker, ref.id, "completed")
    assert not broker.promote_job(ref.id)
    assert broker.get_job(ref.id).state == "completed"


def test_a_deleted_delayed_job_cannot_be_promoted(broker):
    ref = enqueue(broker, {"n": 1}, delay_ms=HOUR_MS)
    assert broker.delete_job(ref.id)
    assert not broker.promote_job(ref.id)
    assert broker.get_job(ref.id) is None
