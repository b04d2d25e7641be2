"""Priorities within a queue: higher first, with aging so that no job starves.

A job's rank is the time it became ready minus priority x the broker's
``priority_aging`` (CONVEYOR_PRIORITY_AGING_SECONDS); the lowest rank is
claimed first. Tests move the aging, not the clock, and sleep only a
fraction of a second.
"""

from __future__ import annotations

import time

import pytest

from conveyor.brokers.base import EnqueueItem
from tests.contract.drive import LONG_TTL, QUEUE, Pump, drain, enqueue, message, record_in

#: Run on the pooler and the cluster too: the level lists must share the queue's cluster slot; the claim runs through the pooler.
pytestmark = pytest.mark.topology


def _take(consumer, timeout=10.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        delivered = next(consumer)
        if delivered is not None:
            return delivered
    raise AssertionError("nothing was handed out in time")


def test_a_higher_priority_job_is_claimed_first(broker, pump):
    for n, priority in enumerate([0, 5, 9, 0, 5]):
        enqueue(broker, {"n": n}, priority=priority)
    assert drain(broker, pump(broker), 5) == [2, 1, 4, 0, 3], "higher first, FIFO within a priority"


def test_a_batch_is_ordered_by_priority_too(broker, pump):
    items = [EnqueueItem(message({"n": n}, priority=p)) for n, p in enumerate([1, 0, 3, 1])]
    broker.enqueue_jobs(items, dedup_ttl=LONG_TTL)
    assert drain(broker, pump(broker), 4) == [2, 0, 3, 1]


def test_aging_lets_an_older_lower_priority_job_through(broker, pump):
    broker.priority_aging = 0.05  # one level is worth 50 ms of waiting
    enqueue(broker, {"n": 0})  # ready first, priority 0
    time.sleep(0.3)
    enqueue(broker, {"n": 1}, priority=1)  # 300 ms later: its 50 ms lead is not enough
    enqueue(broker, {"n": 2}, priority=9)  # its 450 ms lead is
    assert drain(broker, pump(broker), 3) == [2, 0, 1]


@pytest.mark.needs("hand_back")
def test_a_handed_back_job_keeps_its_place(broker):
    enqueue(broker, {"n": 0})
    first = enqueue(broker, {"n": 1}, priority=4)
    enqueue(broker, {"n": 2}, priority=4)
    consumer = broker.consume("contract", prefetch=1, timeout=100)
    try:
        taken = _take(consumer)
        assert taken.message_id == first.id
        consumer.requeue([taken])
        again = _take(consumer)
        assert again.message_id == first.id, "handed back to the front of its level"
    finally:
        consumer.close()


def test_counts_and_lists_include_every_priority(broker):
    refs = [enqueue(broker, {"n": n}, priority=p) for n, p in enumerate([0, 3, 9])]
    assert broker.queue_counts("contract").waiting == 3
    listed = {r.id: r.priority for r in broker.list_jobs("contract", "waiting", limit=10, offset=0)}
    assert listed == {refs[0].id: 0, refs[1].id: 3, refs[2].id: 9}
    assert broker.get_job(refs[2].id).priority == 9, "the record shows the job's priority"


def test_a_delayed_job_is_ranked_in_its_priority_once_due(broker, pump):
    enqueue(broker, {"n": 0})  # ready now, priority 0
    delayed = enqueue(broker, {"n": 1}, delay_ms=100, priority=9)
    promoter = None
    if broker.get_declared_delay_queues():  # redis, inline: a delay queue's consumer promotes it when due
        promoter = Pump(broker, f"{QUEUE}.DQ", prefetch=10)
    try:
        record_in(broker, delayed.id, "waiting")
    finally:
        if promoter is not None:
            promoter.close()
    assert drain(broker, pump(broker), 2) == [1, 0], "due, it ranks as a priority-9 job ready now"
