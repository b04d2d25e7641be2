"""Keyed enqueue: one job per key while the key is held, a new job once it is free."""

from __future__ import annotations

import threading
import time

import pytest

from conveyor.brokers.base import EnqueueItem
from tests.contract.drive import LONG_TTL, OTHER_JOB, OTHER_QUEUE, enqueue, message, record_in


@pytest.mark.topology
def test_a_duplicate_key_returns_the_holder_and_enqueues_nothing(broker):
    first = enqueue(broker, {"n": 1}, key="k:1")
    again = enqueue(broker, {"n": 2}, key="k:1")
    assert again.id == first.id and again.deduplicated and not first.deduplicated
    assert broker.get_job(first.id).payload == {"n": 1}, "the duplicate must not overwrite the holder"
    assert [r.id for r in broker.list_jobs("contract", "waiting")] == [first.id]
    assert broker.queue_counts("contract").waiting == 1


@pytest.mark.topology
@pytest.mark.needs("cross_queue_keys")
def test_a_key_is_held_across_queues_and_within_one_batch(broker):
    first = enqueue(broker, {"n": 1}, key="k:shared")
    refs = broker.enqueue_jobs(
        [
            EnqueueItem(message({"n": 2}, queue_name=OTHER_QUEUE, job=OTHER_JOB), key="k:shared"),
            EnqueueItem(message({"n": 3}), key="k:batch"),
            EnqueueItem(message({"n": 4}), key="k:batch"),
        ],
        dedup_ttl=LONG_TTL,
    )
    assert (refs[0].id, refs[0].deduplicated) == (first.id, True)
    assert not refs[1].deduplicated
    assert (refs[2].id, refs[2].deduplicated) == (refs[1].id, True)
    assert broker.queue_counts(OTHER_QUEUE).waiting == 0
    assert broker.queue_counts("contract").waiting == 2


def test_a_finished_job_holds_its_key_for_the_ttl(broker, pump):
    ref = enqueue(broker, {"n": 1}, key="k:done")
    consumer = pump(broker)
    delivered = consumer.receive()
    assert broker.start_job(delivered) == 1
    consumer.ack(delivered)
    record_in(broker, ref.id, "completed")
    again = enqueue(broker, {"n": 2}, key="k:done")
    assert (again.id, again.deduplicated) == (ref.id, True)


def test_the_key_is_free_again_once_its_ttl_is_over(broker, pump):
    ref = enqueue(broker, {"n": 1}, key="k:ttl", dedup_ttl=0.2)
    consumer = pump(broker)
    delivered = consumer.receive()
    broker.start_job(delivered)
    consumer.ack(delivered)
    record_in(broker, ref.id, "completed")
    time.sleep(0.25)
    fresh = enqueue(broker, {"n": 2}, key="k:ttl")
    assert fresh.id != ref.id and not fresh.deduplicated
    assert broker.get_job(fresh.id).key == "k:ttl"
    assert (enqueue(broker, {"n": 3}, key="k:ttl").id) == fresh.id, "the new job holds the key now"


def test_a_deleted_job_frees_its_key(broker):
    ref = enqueue(broker, {"n": 1}, key="k:deleted")
    assert broker.delete_job(ref.id)
    fresh = enqueue(broker, {"n": 2}, key="k:deleted")
    assert fresh.id != ref.id and not fresh.deduplicated


@pytest.mark.topology
def test_racing_enqueues_of_one_key_make_one_job(broker):
    refs, barrier = [], threading.Barrier(12)

    def race(n):
        barrier.wait()
        refs.append(enqueue(broker, {"n": n}, key="k:race"))

    threads = [threading.Thread(target=race, args=(n,)) for n in range(12)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len({r.id for r in refs}) == 1 and len(refs) == 12
    assert sum(not r.deduplicated for r in refs) == 1
    assert broker.queue_counts("contract").waiting == 1
