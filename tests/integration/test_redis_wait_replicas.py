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


@pytest.fixture(params=["redis_url", "redis_cluster_url"], ids=["redis", "redis-cluster"])
def app(request, clean_env, database_url):
    """On one Redis, and on a cluster whose primaries have no replica: there the WAIT must reach the node
    that ran the script (the cluster client would send a keyless WAIT to every primary)."""
    url = request.getfixturevalue(request.param)
    app = App(make_settings("redis", url, database_url, redis_wait_replicas=1, redis_wait_timeout=0.05))
    yield app
    app.close()


def assert_unreplicated(app: App, queue: str) -> None:
    """An enqueue into ``queue`` no replica acknowledged is of unknown outcome and its claim is refused."""
    with pytest.raises(EnqueueOutcomeUnknown):
        app.jobs.enqueue(f"test.probe.{queue}", {"token": "unreplicated"}, key=f"wait:{queue}")
    # The primary has it (the key finds it): only its replication was not confirmed.
    counts = app.broker.queue_counts(queue)
    assert counts.waiting == 1, counts

    consumer = app.broker.consume(queue, prefetch=1, timeout=1000)
    with pytest.raises(ConnectionClosed) as caught:  # Dramatiq restarts the consumer
        next(consumer)
    assert "replica" in str(caught.value)
    consumer.close()


def test_an_enqueue_no_replica_acknowledged_is_of_unknown_outcome_and_a_claim_is_not_started(app):
    assert_unreplicated(app, "critical")
    # Fetched (and so held by this worker) but never started: the orphan pass hands it back.
    app.broker.release_orphans()
    counts = app.broker.queue_counts("critical")
    assert (counts.waiting, counts.active) == (1, 0), counts
