"""Counts and records: per queue and per state, as the dashboard and ``conveyor status`` read them."""

from __future__ import annotations

import time

import pytest

from tests.contract.drive import OTHER_JOB, OTHER_QUEUE, QUEUE, enqueue, fail, record_in


@pytest.mark.topology
def test_counts_and_lists_follow_every_state_of_one_queue_only(broker, pump):
    empty = broker.queue_counts(QUEUE)
    assert (empty.waiting, empty.delayed, empty.active, empty.failed) == (0, 0, 0, 0)
    assert (empty.completed_total, empty.failed_total, empty.oldest_waiting_at) == (0, 0, None)
    done, dead, running = (enqueue(broker, {"n": n}).id for n in range(3))
    consumer = pump(broker)  # prefetch 1: it holds one job at a time
    delivered = consumer.receive()
    broker.start_job(delivered)
    consumer.ack(delivered)
    record_in(broker, done, "completed")
    delivered = consumer.receive()
    broker.start_job(delivered)
    fail(broker, consumer, delivered, "RuntimeError: no")
    record_in(broker, dead, "failed")
    delivered = consumer.receive()
    assert delivered.message_id == running
    broker.start_job(delivered)
    before = time.time()
    waiting = [enqueue(broker, {"n": n}).id for n in (3, 4)]
    after = time.time()
    delayed = enqueue(broker, {"n": 5}, delay_ms=60_000).id
    other = enqueue(broker, {"n": 6}, queue_name=OTHER_QUEUE, job=OTHER_JOB).id

    counts = broker.queue_counts(QUEUE)
    got = (counts.waiting, counts.delayed, counts.active, counts.failed, counts.completed_total, counts.failed_total)
    assert got == (2, 1, 1, 1, 1, 1)
    assert counts.queue == QUEUE and not counts.paused
    assert before - 1 <= counts.oldest_waiting_at <= after + 1
    lists = {state: {r.id for r in broker.list_jobs(QUEUE, state)} for state in ("waiting", "delayed", "active")}
    lists.update({state: {r.id for r in broker.list_jobs(QUEUE, state)} for state in ("completed", "failed")})
    assert lists == {
        "waiting": set(waiting),
        "delayed": {delayed},
        "active": {running},
        "completed": {done},
        "failed": {dead},
    }
    others = broker.queue_counts(OTHER_QUEUE)
    got = (others.waiting, others.delayed, others.active, others.failed, others.completed_total, others.failed_total)
    assert got == (1, 0, 0, 0, 0, 0)
    assert [r.id for r in broker.list_jobs(OTHER_QUEUE, "waiting")] == [other]


def test_finished_jobs_are_listed_newest_first(broker, pump):
    ids = [enqueue(broker, {"n": n}).id for n in range(3)]
    consumer = pump(broker)
    for job_id in ids:
        delivered = consumer.receive()
        broker.start_job(delivered)
        consumer.ack(delivered)
        record_in(broker, job_id, "completed")
        time.sleep(0.01)  # distinct finishing times, even on a clock of milliseconds
    assert [r.id for r in broker.list_jobs(QUEUE, "completed")] == ids[::-1]
    assert [r.id for r in broker.list_jobs(QUEUE, "completed", limit=1, offset=1)] == [ids[1]]


@pytest.mark.topology
def test_retry_failed_puts_every_failed_job_of_a_queue_back(broker, pump):
    ids = [enqueue(broker, {"n": n}).id for n in range(2)]
    consumer = pump(broker)
    for job_id in ids:
        delivered = consumer.receive()
        broker.start_job(delivered)
        fail(broker, consumer, delivered, "RuntimeError: no")
        record_in(broker, job_id, "failed")
    broker.pause_queue(QUEUE)
    assert broker.retry_failed(QUEUE) == 2
    counts = broker.queue_counts(QUEUE)
    assert (counts.failed, counts.waiting, counts.failed_total) == (0, 2, 2)
    assert broker.retry_failed(QUEUE) == 0


def test_running_counts_started_jobs_and_prefetched_the_ones_fetched_ahead(broker, pump):
    ref = enqueue(broker, {"n": 1})
    consumer = pump(broker)
    delivered = consumer.receive()
    fetched = broker.queue_counts(QUEUE)
    # Fetched, not started: prefetched where a fetch claims the job (redis, postgres); inline claims at the start.
    assert fetched.running == 0 and fetched.prefetched == fetched.active and fetched.active in (0, 1)
    assert broker.start_job(delivered) == 1
    started = broker.queue_counts(QUEUE)
    assert (started.active, started.running, started.prefetched) == (1, 1, 0)
    consumer.ack(delivered)
    record_in(broker, ref.id, "completed")
    done = broker.queue_counts(QUEUE)
    assert (done.active, done.running, done.prefetched) == (0, 0, 0)
