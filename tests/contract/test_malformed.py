"""A stored message this worker cannot decode: its job fails alone, with a clear error, and its hook runs."""

from __future__ import annotations

import json

import pytest

from tests.contract.conftest import BROKER_OF
from tests.contract.drive import JOB, QUEUE, enqueue, eventually, message, record_in


def newer_format(job_id: str, payload: dict) -> bytes:
    """A job's message as a newer producer might write it: one top-level field this version does not know."""
    fields = json.loads(message(payload).encode())
    fields.update(message_id=job_id, trace_context={"id": "abc"})
    return json.dumps(fields, separators=(",", ":")).encode()


def not_a_message(job_id: str, payload: dict) -> bytes:
    """JSON that is no Dramatiq message at all (a row written by hand, another program's data): no id in it."""
    return b'{"not":"a message"}'


def truncated(job_id: str, payload: dict) -> bytes:
    """A body cut short before its id (a partial write): not JSON at all, so no id can be read from it."""
    return message(payload).encode()[:20]


#: Shapes a broker cannot store at all, so cannot meet: (broker class, stored shape) -> why.
UNSTORABLE = {
    ("postgres", "truncated"): "the message column is jsonb: a body that is not JSON cannot be stored",
}


@pytest.mark.topology
@pytest.mark.needs("stored_messages")
@pytest.mark.parametrize("stored", [newer_format, not_a_message, truncated])
def test_a_message_that_no_longer_decodes_fails_its_job_and_runs_its_final_failure_hook(
    broker, pump, store_message, final_failures, stored, broker_name
):
    unstorable = UNSTORABLE.get((BROKER_OF[broker_name], stored.__name__))
    if unstorable:
        pytest.skip(unstorable)
    bad = enqueue(broker, {"n": 1})
    good = enqueue(broker, {"n": 2})
    store_message(broker, bad.id, stored(bad.id, {"n": 1}))
    consumer = pump(broker)
    delivered = consumer.receive()
    assert delivered.message_id == good.id, "the malformed message was handed to the worker"
    assert broker.start_job(delivered) == 1
    consumer.ack(delivered)
    record_in(broker, good.id, "completed")
    record = record_in(broker, bad.id, "failed")
    assert record.error.startswith("MalformedMessage: the stored message cannot be decoded")
    assert record.finished_at is not None
    counts = broker.queue_counts(QUEUE)
    assert (counts.waiting, counts.active, counts.failed, counts.completed_total, counts.failed_total) == (
        0,
        0,
        1,
        1,
        1,
    )
    assert [r.id for r in broker.list_jobs(QUEUE, "failed")] == [bad.id]
    eventually(lambda: final_failures, what="the final-failure hook")
    assert final_failures == [(bad.id, JOB, record.error)]
    consumer.nothing(within=0.3)


@pytest.mark.topology
@pytest.mark.needs("stored_messages")
def test_an_unreadable_message_fails_its_job_behind_a_backlog_that_entered_waiting_before_it(
    broker, pump, store_message, final_failures
):
    """Redis finds the job of a message with no readable id by the rid it fetched, scanning the queue's waiting
    jobs oldest first in pages: a priority job that overtook a long backlog is found past the first page."""
    backlog = [enqueue(broker, {"n": n}) for n in range(150)]
    bad = enqueue(broker, {"n": -1}, priority=9)
    store_message(broker, bad.id, not_a_message(bad.id, {}))
    consumer = pump(broker)
    delivered = consumer.receive()
    assert delivered.message_id == backlog[0].id, "the malformed message was handed to the worker"
    record = record_in(broker, bad.id, "failed")
    assert record.error.startswith("MalformedMessage: the stored message cannot be decoded")
    eventually(lambda: final_failures, what="the final-failure hook")
    assert final_failures == [(bad.id, JOB, record.error)]
    counts = broker.queue_counts(QUEUE)
    assert (counts.failed, counts.failed_total) == (1, 1)
