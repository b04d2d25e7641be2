"""Recovery: a dead worker's jobs go back to their queue, and its late calls change nothing."""

from __future__ import annotations

import time

import pytest

from conveyor.brokers.base import FINALIZE
from tests.contract.conftest import LEASE
from tests.contract.drive import QUEUE, enqueue, eventually, fail, record_in

pytestmark = pytest.mark.needs("recovery", "fence")


def _recover(rescuer, ids, timeout=8 * LEASE):
    """Run ``rescuer.maintain()`` until every id in ``ids`` was recovered; returns what it recovered."""
    recovered: set[str] = set()

    def done():
        for queue, found in rescuer.maintain().items():
            assert queue == QUEUE, f"recovered jobs of {queue}, which nobody held"
            recovered.update(found)
        return recovered >= set(ids)

    eventually(done, timeout, f"recovery of {sorted(ids)}")
    return recovered


@pytest.mark.topology
def test_a_dead_workers_jobs_go_back_to_their_queue(broker, peer, pump, hang):
    started, prefetched = enqueue(broker, {"n": 1}).id, enqueue(broker, {"n": 2}).id
    dying = pump(broker, prefetch=2)
    first, second = dying.receive(), dying.receive()
    assert broker.start_job(first) == 1
    hang(broker, dying)
    rescuer = peer()
    assert _recover(rescuer, [started, prefetched]) == {started, prefetched}
    record = broker.get_job(first.message_id)
    assert (record.state, record.attempts) == ("waiting", 1), "the dead worker's start still counts"
    assert broker.get_job(second.message_id).state == "waiting"
    assert broker.queue_counts(QUEUE).waiting == 2 and broker.queue_counts(QUEUE).active == 0
    assert rescuer.maintain() == {}, "a job is recovered once"
    consumer = pump(rescuer, prefetch=2)
    again = {m.message_id: m for m in (consumer.receive(), consumer.receive())}
    assert set(again) == {started, prefetched}
    assert rescuer.start_job(again[started]) == 2
    assert rescuer.start_job(again[prefetched]) == 1


@pytest.mark.topology
def test_a_live_workers_jobs_are_left_alone(broker, peer, pump):
    ref = enqueue(broker, {"n": 1})
    alive = pump(broker)
    delivered = alive.receive()
    broker.start_job(delivered)
    rescuer = peer()
    until = time.monotonic() + 1.5 * LEASE
    while time.monotonic() < until:
        broker.maintain()  # a worker's maintenance pass (Redis heartbeats with it; Postgres on a thread)
        assert rescuer.maintain() == {}, "a job of a worker that heartbeats must not be recovered"
        time.sleep(0.1)
    record = broker.get_job(ref.id)
    assert (record.state, record.attempts) == ("active", 1)
    assert broker.start_job(delivered) == 1, "its delivery is still the current one"
    alive.ack(delivered)
    record_in(broker, ref.id, "completed")


@pytest.mark.topology
def test_the_dead_workers_late_start_and_ack_are_refused(broker, peer, pump, hang):
    ref = enqueue(broker, {"n": 1})
    dying = pump(broker)
    stale = dying.receive()
    assert broker.start_job(stale) == 1
    hang(broker, dying)
    rescuer = peer()
    _recover(rescuer, [ref.id])
    consumer = pump(rescuer)
    current = consumer.receive()
    assert rescuer.start_job(current) == 2
    # The dead worker wakes up (a long pause, not a death) and carries on with its old delivery.
    assert broker.start_job(stale) == 0, "a superseded delivery must not start"
    dying.ack(stale)
    broker.close()  # writes whatever outcome it still buffers
    record = broker.get_job(ref.id)
    assert (record.state, record.attempts) == ("active", 2), "the stale ack must not end the current delivery"
    consumer.ack(current)
    assert record_in(rescuer, ref.id, "completed").attempts == 2
    assert rescuer.queue_counts(QUEUE).completed_total == 1


@pytest.mark.topology
def test_the_final_failure_claim_is_won_by_the_current_delivery_only(broker, peer, pump, hang):
    ref = enqueue(broker, {"n": 1})
    dying = pump(broker)
    stale = dying.receive()
    broker.start_job(stale)
    hang(broker, dying)
    rescuer = peer()
    _recover(rescuer, [ref.id])
    consumer = pump(rescuer)
    current = consumer.receive()
    rescuer.start_job(current)
    assert fail(broker, dying, stale, "RuntimeError: stale") is False, "a superseded delivery claims nothing"
    broker.close()
    assert broker.get_job(ref.id).state == "active", "the stale nack must not fail the current delivery"
    assert fail(rescuer, consumer, current, "RuntimeError: current") is True
    record = record_in(rescuer, ref.id, "failed")
    assert (record.attempts, record.error) == (2, "RuntimeError: current")
    counts = rescuer.queue_counts(QUEUE)
    assert (counts.failed, counts.failed_total, counts.active) == (1, 1, 0)


@pytest.mark.topology
def test_hooks_claimed_by_a_dead_worker_run_again_in_a_finalize_delivery(broker, peer, pump, hang):
    """Claimed, never marked done (the worker died in its hooks): the job comes back to run the hooks only."""
    ref = enqueue(broker, {"n": 1})
    dying = pump(broker)
    stale = dying.receive()
    assert broker.start_job(stale) == 1
    stale.fail()
    stale.options["last_error"] = "RuntimeError: broken for good"
    assert broker.claim_final_failure(stale) is True
    hang(broker, dying)  # dies in its hooks: no nack
    record = broker.get_job(ref.id)
    assert record.state == "active" and broker.queue_counts(QUEUE).failed_total == 0, "not failed before its hooks"
    rescuer = peer()
    _recover(rescuer, [ref.id])
    consumer = pump(rescuer)
    again = consumer.receive()
    assert again.options.get(FINALIZE) is True, "the next delivery runs the hooks only"
    assert rescuer.get_job(ref.id).error == "RuntimeError: broken for good", "the hooks get the job's error"
    assert broker.claim_final_failure(stale) is False, "the dead worker's delivery no longer holds the claim"
    assert fail(rescuer, consumer, again, "RuntimeError: broken for good") is True
    record = record_in(rescuer, ref.id, "failed")
    assert (record.attempts, record.error) == (1, "RuntimeError: broken for good"), "a finalize delivery is no attempt"
    counts = rescuer.queue_counts(QUEUE)
    assert (counts.failed, counts.failed_total, counts.active, counts.waiting) == (1, 1, 0, 0)
    consumer.nothing(within=0.3)
