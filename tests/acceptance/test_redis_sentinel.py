"""The Redis broker through Redis Sentinel: ``SENTINEL FAILOVER`` mid-run, and the jobs keep flowing.

A primary, a replica and three sentinels (tests/support/sentinel.py), worker
processes on ``REDIS_URL=redis+sentinel://…/mymaster`` with
``CONVEYOR_REDIS_WAIT_REPLICAS=1`` (each enqueue and claim WAITs for the
replica: replication is asynchronous, and a failover loses what the new
primary had not received). Charges go through the ledger: after the
failover every one of them is applied exactly once, whatever ran twice.
"""

from __future__ import annotations

import time

import pytest

from conveyor.errors import ConveyorError
from tests.acceptance.test_pg_processes import assert_ledger_exact, charges, rows
from tests.support.harness import make_settings
from tests.support.waiting import wait_for


@pytest.fixture(scope="module")
def sentinels():
    from tests.support.sentinel import SentinelGroup

    group = SentinelGroup()
    try:
        yield group
    finally:
        group.close()


@pytest.fixture
def settings(clean_env, database_url, sentinels):
    return make_settings("redis", sentinels.url, database_url, redis_wait_replicas=1, redis_socket_timeout=3)


def enqueue(app, batch: list[dict]) -> None:
    """Enqueue, again on an error (every request has a key: a repeat returns the first job)."""
    for attempt in range(30):
        try:
            app.jobs.enqueue_many(batch)
            return
        except ConveyorError:
            time.sleep(0.2)
    app.jobs.enqueue_many(batch)


def test_jobs_keep_flowing_through_a_sentinel_failover_and_charge_once(app, workers, settings, database_url, sentinels):
    group = workers("critical", processes=2)
    wait_for(lambda: len(group.child_pids()) == 2, timeout=60, message="two worker processes")
    requests = charges(120, "sentinel", sleep=0.05)
    first, second = requests[:60], requests[60:]
    enqueue(app, first)
    wait_for(
        lambda: rows(database_url, "SELECT count(*) FROM credit_entries")[0][0] >= 15,
        timeout=60,
        interval=0.05,
        message="charges running before the failover",
    )
    before = sentinels.primary_port()
    after = sentinels.failover()
    assert after != before
    enqueue(app, second)
    wait_for(
        lambda: rows(database_url, "SELECT count(*) FROM credit_entries")[0][0] >= len(requests),
        timeout=120,
        interval=0.2,
        message="every charge applied after the failover",
    )
    assert_ledger_exact(settings, database_url, requests)
    # The workers follow the new primary: the queue drains there.
    wait_for(
        lambda: (lambda c: c.waiting + c.delayed + c.active == 0)(app.broker.queue_counts("critical")),
        timeout=60,
        message="the queue idle on the new primary",
    )
