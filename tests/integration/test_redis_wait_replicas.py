"""CONVEYOR_REDIS_WAIT_REPLICAS on a Redis whose replicas do not acknowledge (here: it has none).

An enqueue the replicas lack is never reported as done (its outcome is
unknown: the primary has it, a failover may not), and a claim they lack is
not started: the consumer gives up the fetch and the worker's orphan pass
hands the job back to its queue. tests/acceptance/test_redis_sentinel.py
runs the same setting through a real failover.
"""

from __future__ import annotations

import pytest
from dramatiq.errors import ConnectionClosed

from conveyor.app import App
from conveyor.errors import EnqueueOutcomeUnknown
from tests.support.harness import make_settings


@pytest.fixture
def app(clean_env, redis_url, database_url):
    app = App(make_settings("redis", redis_url, database_url, redis_wait_replicas=1, redis_wait_timeout=0.05))
    yield app
    app.close()


def test_an_enqueue_no_replica_acknowledged_is_of_unknown_outcome_and_a_claim_is_not_started(app, redis_url):
    with pytest.raises(EnqueueOutcomeUnknown):
        app.jobs.enqueue("test.probe.critical", {"token": "unreplicated"}, key="wait:1")
    # The primary has it (the key finds it): only its replication was not confirmed.
    counts = app.broker.queue_counts("critical")
    assert counts.waiting == 1, counts

    consumer = app.broker.consume("critical", prefetch=1, timeout=1000)
    with pytest.raises(ConnectionClosed) as caught:  # Dramatiq restarts the consumer
        next(consumer)
    assert "replica" in str(caught.value)
    consumer.close()
    # Fetched (and so held by this worker) but never started: the orphan pass hands it back.
    app.broker.release_orphans()
    counts = app.broker.queue_counts("critical")
    assert (counts.waiting, counts.active) == (1, 0), counts
