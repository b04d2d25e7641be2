"""A job that has spent its attempts never runs its body again, even when its final-failure claim fails."""

from __future__ import annotations

import pytest
from dramatiq.broker import MessageProxy
from dramatiq.middleware import SkipMessage

from conveyor.errors import BrokerRejected
from conveyor.middleware.retries import Retries
from tests.contract.drive import JOB, enqueue


@pytest.mark.topology
@pytest.mark.needs("fence")
def test_a_spent_job_whose_final_claim_fails_is_skipped_not_run(broker, pump, monkeypatch):
    broker.get_actor(JOB).options.update(max_attempts=1, min_backoff=10, max_backoff=10)
    ref = enqueue(broker, {"n": 1})
    consumer = pump(broker)
    first = consumer.receive()
    assert broker.start_job(first) == 1
    consumer.requeue([first])  # its worker died: the job comes back with its one attempt spent
    second = consumer.receive()
    assert second.message_id == ref.id

    def refused(message):
        raise BrokerRejected("final-failure claim refused: OOM command not allowed")

    monkeypatch.setattr(broker, "claim_final_failure", refused)  # the server refuses the write (OOM, READONLY)
    hooks = []
    retries = Retries(lambda *args: hooks.append(args))
    proxy = second if isinstance(second, MessageProxy) else MessageProxy(second)
    with pytest.raises(SkipMessage):  # anything else is swallowed by Dramatiq, and the body would run
        retries.before_process_message(broker, proxy)
    assert hooks == []
