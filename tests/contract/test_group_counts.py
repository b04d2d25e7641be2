"""The groups view's counts (``group_counts``): per named group of a queue, its waiting and held jobs.

Not marked ``needs("groups")``: a broker that serves no group apart (inline) still keeps each job's
group, so it counts them the same.
"""

from __future__ import annotations

import time

import pytest
from dramatiq import Message

from conveyor.brokers.base import EnqueueItem
from tests.contract.drive import JOB, LONG_TTL, OTHER_JOB, OTHER_QUEUE, QUEUE, eventually


def grouped(
    n: int, group: str | None, *, queue: str = QUEUE, job: str = JOB, delay_ms: int | None = None
) -> EnqueueItem:
    options = {"group": group} if group else {}
    message = Message(queue_name=queue, actor_name=job, args=({"n": n, "g": group},), kwargs={}, options=options)
    return EnqueueItem(message, delay_ms=delay_ms)


#: Run on the pooler and the cluster too: the group keys must be read on the queue's slot.
@pytest.mark.topology
def test_group_counts_list_the_busiest_named_groups_with_their_waiting_and_held_jobs(broker, pump):
    empty = broker.group_counts(QUEUE)
    assert (empty.groups, empty.total) == ([], 0)
    before = time.time()
    broker.enqueue_jobs([grouped(n, "busy") for n in range(4)], dedup_ttl=LONG_TTL)
    after = time.time()
    # One of busy's jobs held (and started) by a worker: the only group with jobs yet.
    consumer = pump(broker, prefetch=1)
    held = consumer.receive()
    broker.start_job(held)
    assert held.args[0]["g"] == "busy"
    broker.enqueue_jobs(
        [grouped(0, "quiet"), grouped(1, None), grouped(2, None), grouped(3, "later", delay_ms=60_000)],
        dedup_ttl=LONG_TTL,
    )
    broker.enqueue_jobs([grouped(0, "elsewhere", queue=OTHER_QUEUE, job=OTHER_JOB)], dedup_ttl=LONG_TTL)

    def named() -> dict[str, tuple[int, int]]:
        return {g.group: (g.waiting, g.active) for g in broker.group_counts(QUEUE).groups}

    eventually(lambda: named() == {"busy": (3, 1), "quiet": (1, 0)}, what="busy's 3 waiting and 1 held, quiet's 1")

    counts = broker.group_counts(QUEUE)
    assert counts.queue == QUEUE and counts.total == 2
    # Most waiting first; the default group (no name) and the delayed job's group are not listed.
    assert counts.groups[0].group == "busy"
    busy = counts.groups[0]
    assert before - 1 <= busy.oldest_waiting_at <= after + 1
    assert all(g.oldest_waiting_at is None for g in counts.groups if g.waiting == 0)

    top = broker.group_counts(QUEUE, limit=1)
    assert [g.group for g in top.groups] == ["busy"] and top.total == 2
    assert [g.group for g in broker.group_counts(OTHER_QUEUE).groups] == ["elsewhere"]

    # The held job acked: its group holds nothing any more.
    consumer.ack(held)
    eventually(lambda: named()["busy"] == (3, 0), what="busy to hold nothing once its job was acked")
