"""Enqueue and read back: what an enqueue returns and the record it leaves."""

from __future__ import annotations

import time

import pytest

from conveyor.brokers.base import EnqueueItem
from conveyor.errors import InvalidQuery
from tests.contract.drive import JOB, LONG_TTL, OTHER_JOB, OTHER_QUEUE, QUEUE, enqueue, message


@pytest.mark.topology
def test_an_enqueued_job_reads_back_as_waiting(broker):
    before = time.time()
    ref = enqueue(broker, {"n": 1, "text": "héllo"})
    assert not ref.deduplicated
    record = broker.get_job(ref.id)
    assert record is not None
    assert (record.id, record.queue, record.job, record.state) == (ref.id, QUEUE, JOB, "waiting")
    assert (record.attempts, record.key, record.error, record.payload) == (0, None, None, {"n": 1, "text": "héllo"})
    assert before - 1 <= record.enqueued_at <= time.time() + 1
    assert record.started_at is None and record.finished_at is None
    assert broker.get_job("no-such-job") is None


@pytest.mark.topology
def test_a_batch_returns_one_ref_per_item_in_order(broker):
    items = [EnqueueItem(message({"n": n})) for n in range(3)]
    items.append(EnqueueItem(message({"n": 3}, queue_name=OTHER_QUEUE, job=OTHER_JOB), key="batch:k"))
    refs = broker.enqueue_jobs(items, dedup_ttl=LONG_TTL)
    assert [r.id for r in refs] == [i.message.message_id for i in items]
    assert not any(r.deduplicated for r in refs)
    assert [broker.get_job(r.id).payload["n"] for r in refs] == [0, 1, 2, 3]
    assert broker.get_job(refs[3].id).key == "batch:k"
    assert broker.get_job(refs[3].id).queue == OTHER_QUEUE


def test_list_jobs_gives_the_waiting_jobs_of_one_queue(broker):
    ids = {enqueue(broker, {"n": n}).id for n in range(3)}
    enqueue(broker, {"n": 9}, queue_name=OTHER_QUEUE, job=OTHER_JOB)
    listed = broker.list_jobs(QUEUE, "waiting")
    assert {r.id for r in listed} == ids
    assert all(r.state == "waiting" and r.queue == QUEUE for r in listed)
    assert len(broker.list_jobs(QUEUE, "waiting", limit=2)) == 2
    assert broker.list_jobs(QUEUE, "completed") == []


def test_list_jobs_refuses_an_unknown_state_without_quoting_it(broker):
    with pytest.raises(InvalidQuery) as refused:
        broker.list_jobs(QUEUE, "zq9mark")
    assert "zq9mark" not in str(refused.value) and "waiting" in str(refused.value)
