"""Claiming: FIFO within a queue, queues apart, pausing (job priorities: test_priority.py)."""

from __future__ import annotations

import pytest

from conveyor.brokers.base import EnqueueItem
from tests.contract.drive import JOB, LONG_TTL, OTHER_JOB, OTHER_QUEUE, URGENT_JOB, drain, enqueue, message


@pytest.mark.topology
def test_jobs_are_claimed_in_the_order_they_were_enqueued(broker, pump):
    for n in range(4):
        enqueue(broker, {"n": n})
    assert drain(broker, pump(broker), 4) == [0, 1, 2, 3]


def test_a_batch_is_claimed_in_its_order(broker, pump):
    broker.enqueue_jobs([EnqueueItem(message({"n": n})) for n in range(4)], dedup_ttl=LONG_TTL)
    assert drain(broker, pump(broker), 4) == [0, 1, 2, 3]


def test_an_actors_dramatiq_priority_orders_no_claim(broker, pump):
    # Jobs are ordered by their own priority (test_priority.py); Dramatiq's actor option
    # (lower first) orders only a worker's own work queue.
    enqueue(broker, {"n": 0}, job=JOB)  # actor priority 10
    enqueue(broker, {"n": 1}, job=URGENT_JOB)  # actor priority 0
    assert drain(broker, pump(broker), 2) == [0, 1]


@pytest.mark.topology
def test_a_consumer_gets_only_its_own_queue(broker, pump):
    other = enqueue(broker, {"n": 1}, queue_name=OTHER_QUEUE, job=OTHER_JOB)
    mine = enqueue(broker, {"n": 2})
    consumer = pump(broker)
    assert consumer.receive().message_id == mine.id
    consumer.nothing(within=0.2)
    assert broker.get_job(other.id).state == "waiting"


def test_a_paused_queue_hands_out_nothing_until_resumed(broker, pump):
    broker.pause_queue("contract")
    ref = enqueue(broker, {"n": 1})
    consumer = pump(broker)
    consumer.nothing(within=0.3)
    assert broker.get_job(ref.id).state == "waiting"
    assert broker.queue_counts("contract").paused
    broker.resume_queue("contract")
    assert consumer.receive().message_id == ref.id
    assert not broker.queue_counts("contract").paused
