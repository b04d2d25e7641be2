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


#: Known gaps, run as strict xfails so the fix shows (an XPASS fails): (broker class, stored shape) -> why.
KNOWN_GAPS = {
    ("redis", "not_a_message"): "Redis dead-letters a message whose id it cannot read, but leaves its job "
    "waiting for good (no failed state, no hook, failed_total counted); jobs.lua finds the job by the "
    "message's own id only",
}


@pytest.mark.topology
@pytest.mark.needs("stored_messages")
@pytest.mark.parametrize("stored", [newer_format, not_a_message])
def test_a_message_that_no_longer_decodes_fails_its_job_and_runs_its_final_failure_hook(
    broker, pump, store_message, final_failures, stored, broker_name, request
):
    gap = KNOWN_GAPS.get((BROKER_OF[broker_name], stored.__name__))
    if gap:
        request.applymarker(pytest.mark.xfail(strict=True, reason=gap))
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
