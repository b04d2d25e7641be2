"""Cancel (issue 21): a waiting or delayed job never starts; a held one is asked, and its holder ends it.

Every write stays fenced: the ``cancelled`` outcome only from the current delivery, and once a job is
cancelled no late ack, nack or retry of any delivery changes it.
"""

from __future__ import annotations

import time

import pytest

from conveyor.brokers.base import CANCELLED, CANCELLED_AT_START, FINALIZE, CancelOutcome
from tests.contract.conftest import LEASE
from tests.contract.drive import QUEUE, enqueue, eventually, fail, record_in, retry

HOUR_MS = 3_600_000


def test_a_cancelled_waiting_job_never_starts(broker, pump):
    ref = enqueue(broker, {"n": 1})
    assert broker.cancel_job(ref.id) == CancelOutcome.CANCELLED
    record = broker.get_job(ref.id)
    assert record.state == "cancelled" and record.finished_at is not None
    assert [r.id for r in broker.list_jobs(QUEUE, "cancelled")] == [ref.id]
    counts = broker.queue_counts(QUEUE)
    assert (counts.waiting, counts.active, counts.cancelled) == (0, 0, 1)
    consumer = pump(broker)
    consumer.nothing(within=0.5)
    assert broker.get_job(ref.id).state == "cancelled"
    assert broker.cancel_job(ref.id) == CancelOutcome.FINISHED, "a second cancel is a no-op"


def test_a_cancelled_delayed_job_never_starts_even_from_a_holder(broker, pump):
    consumer = pump(broker)
    ref = enqueue(broker, {"n": 1}, delay_ms=1000)
    time.sleep(0.4)  # a broker with delay queues has handed it to the pump, which holds it until its eta
    assert broker.get_job(ref.id).state == "delayed"
    assert broker.cancel_job(ref.id) == CancelOutcome.CANCELLED
    consumer.nothing(within=1.5)  # past its eta: the holder's copy is refused, never delivered
    assert broker.get_job(ref.id).state == "cancelled"


def test_a_prefetched_job_cancelled_before_its_start_ends_at_the_start(broker, pump):
    ref = enqueue(broker, {"n": 1})
    consumer = pump(broker)
    delivered = consumer.receive()
    # Held by the consumer (inline: still waiting until its start, so cancelled at once): either way it never runs.
    assert broker.cancel_job(ref.id) in (CancelOutcome.REQUESTED, CancelOutcome.CANCELLED)
    assert broker.start_job(delivered) == CANCELLED_AT_START
    assert delivered.options.get(CANCELLED)
    consumer.ack(delivered)  # what Dramatiq does after the skip: it changes nothing
    record = record_in(broker, ref.id, "cancelled")
    assert record.attempts == 0, "never started"


@pytest.mark.topology
def test_a_running_job_is_asked_and_its_outcome_is_fenced(broker, pump):
    ref = enqueue(broker, {"n": 1})
    consumer = pump(broker)
    delivered = consumer.receive()
    assert broker.start_job(delivered) == 1
    listener = broker.cancel_listener()
    try:
        if listener is not None:
            listener.wait(0.05)  # subscribed before the cancel is published
        asked_at = time.monotonic()
        assert broker.cancel_job(ref.id) == CancelOutcome.REQUESTED
        assert broker.get_job(ref.id).state == "active", "a running job runs on until its holder ends it"
        assert broker.cancel_requested([ref.id, "no-such-job"]) == {ref.id}
        if listener is not None:
            heard: list[str] = []
            eventually(lambda: heard.extend(listener.wait(0.1)) or ref.id in heard, timeout=2, what="wake-up")
            assert time.monotonic() - asked_at < 1.0
    finally:
        if listener is not None:
            listener.close()
    assert broker.cancel_outcome(delivered, "JobCancelled: stopped")
    consumer.ack(delivered)  # the late ack of the same delivery: refused to change anything
    record = record_in(broker, ref.id, "cancelled")
    assert record.attempts == 1
    assert broker.cancel_job(ref.id) == CancelOutcome.FINISHED
    assert not broker.cancel_requested([ref.id])
    counts = broker.queue_counts(QUEUE)
    assert (counts.active, counts.cancelled, counts.completed_total) == (0, 1, 0)


def test_a_job_not_asked_to_cancel_cannot_be_ended_cancelled(broker, pump):
    ref = enqueue(broker, {"n": 1})
    consumer = pump(broker)
    delivered = consumer.receive()
    broker.start_job(delivered)
    assert not broker.cancel_outcome(delivered)
    consumer.ack(delivered)
    record_in(broker, ref.id, "completed")


def test_a_retry_after_the_cancel_outcome_changes_nothing(broker, pump):
    ref = enqueue(broker, {"n": 1})
    consumer = pump(broker)
    delivered = consumer.receive()
    broker.start_job(delivered)
    broker.cancel_job(ref.id)
    assert broker.cancel_outcome(delivered)
    retry(broker, consumer, delivered, "ValueError: late", delay_ms=0)
    consumer.nothing(within=0.5)
    assert broker.get_job(ref.id).state == "cancelled"


def _recover(rescuer, job_id):
    eventually(lambda: job_id in rescuer.maintain().get(QUEUE, []), 8 * LEASE, f"recovery of {job_id}")


@pytest.mark.topology
@pytest.mark.needs("recovery", "fence")
def test_a_superseded_delivery_cannot_write_the_cancel_outcome(broker, peer, pump, hang):
    ref = enqueue(broker, {"n": 1})
    dying = pump(broker)
    stale = dying.receive()
    broker.start_job(stale)
    hang(broker, dying)
    rescuer = peer()
    _recover(rescuer, ref.id)
    second = pump(rescuer).receive()
    assert rescuer.start_job(second) == 2
    assert rescuer.cancel_job(ref.id) == CancelOutcome.REQUESTED
    assert not broker.cancel_outcome(stale), "a superseded delivery's outcome is refused"
    assert rescuer.get_job(ref.id).state == "active"
    assert rescuer.cancel_outcome(second)
    record_in(rescuer, ref.id, "cancelled")


def test_unknown_and_finished_jobs(broker, pump):
    assert broker.cancel_job("no-such-job") is None
    ref = enqueue(broker, {"n": 1})
    consumer = pump(broker)
    delivered = consumer.receive()
    broker.start_job(delivered)
    consumer.ack(delivered)
    record_in(broker, ref.id, "completed")
    assert broker.cancel_job(ref.id) == CancelOutcome.FINISHED
    assert broker.get_job(ref.id).state == "completed"


@pytest.mark.topology
@pytest.mark.needs("recovery")
def test_a_stored_cancel_ends_the_job_at_its_next_start_after_its_worker_died(broker, peer, pump, hang):
    """The cancellation is stored: the worker that held the job died; the next start ends it, unrun."""
    ref = enqueue(broker, {"n": 1})
    dying = pump(broker)
    delivered = dying.receive()
    broker.start_job(delivered)
    assert broker.cancel_job(ref.id) == CancelOutcome.REQUESTED
    hang(broker, dying)
    rescuer = peer()
    _recover(rescuer, ref.id)
    again = pump(rescuer).receive()
    assert rescuer.start_job(again) == CANCELLED_AT_START
    record = record_in(rescuer, ref.id, "cancelled")
    assert record.attempts == 1, "the run that died is the only one"


@pytest.mark.topology
@pytest.mark.needs("recovery")
def test_a_job_that_failed_for_good_is_not_cancelled_while_its_hooks_wait_to_run_again(broker, peer, pump, hang):
    """Replay of seed 226143 (Redis, kill-hook): the worker running a job's final-failure hook was killed,
    recovery put the job back for a finalize delivery, and a cancel then found it waiting and ended it
    cancelled: a job whose failure was decided, and whose hook, started once, would never run to its end.
    Its end is decided: the cancel answers finished, the finalize delivery runs the hooks, it ends failed."""
    ref = enqueue(broker, {"n": 1})
    dying = pump(broker)
    stale = dying.receive()
    assert broker.start_job(stale) == 1
    stale.fail()
    stale.options["last_error"] = "RuntimeError: broken for good"
    assert broker.claim_final_failure(stale) is True
    hang(broker, dying)  # dies in its hooks: no nack
    rescuer = peer()
    _recover(rescuer, ref.id)
    assert rescuer.cancel_job(ref.id) == CancelOutcome.FINISHED
    consumer = pump(rescuer)
    again = consumer.receive()
    assert again.options.get(FINALIZE) is True, "the next delivery runs the hooks only"
    assert fail(rescuer, consumer, again, "RuntimeError: broken for good") is True
    record = record_in(rescuer, ref.id, "failed")
    assert record.error == "RuntimeError: broken for good"


@pytest.mark.topology
@pytest.mark.needs("hand_back", "recovery")
def test_a_cancel_outcome_that_could_not_be_written_never_lets_the_runs_ack_complete_the_job(broker, pump):
    """Soak seeds 833632, 614412, 57528 (Redis, under OOM and restarts): the holder's ``cancelled`` outcome was
    refused, so it left the delivery unsettled; Dramatiq then acks the run (a cancelled run is not failed), and
    that ack, buffered, completed the job once Redis took writes again. Fenced like an ack, the cancel must win:
    the ack writes nothing, the job comes back and its next start ends it cancelled."""
    ref = enqueue(broker, {"n": 1})
    consumer = pump(broker)
    delivered = consumer.receive()
    assert broker.start_job(delivered) == 1
    assert broker.cancel_job(ref.id) == CancelOutcome.REQUESTED
    delivered.options[CANCELLED] = True  # what the Cancellation middleware marks before it writes the outcome
    broker.leave_unsettled(delivered, "cancel outcome not written: the contract's")
    consumer.ack(delivered)  # what Dramatiq does next
    if hasattr(broker, "acks"):
        broker.acks.flush()  # a buffered ack (Redis) reaches the server now
    assert broker.get_job(ref.id).state != "completed", "the run's ack completed a job whose cancel was asked"

    def back():
        broker.maintain()  # Postgres: the row left held comes back after its lease (Redis handed it back at the ack)
        return consumer.poll(0.2)

    again = eventually(back, 8 * LEASE, "the job to come back")
    assert broker.start_job(again) == CANCELLED_AT_START
    record = record_in(broker, ref.id, "cancelled")
    assert record.attempts == 1, "the run whose outcome was lost is the only one"
    counts = broker.queue_counts(QUEUE)
    assert (counts.completed_total, counts.cancelled) == (0, 1)
