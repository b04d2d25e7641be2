"""The exactly-once credit run on a private three-primary Redis Cluster (``redis+cluster://``).

Worker processes on ``REDIS_URL=redis+cluster://…`` (tests/support/cluster.py)
charge through the ledger; one of them is SIGKILLed mid-run. Its jobs come back
after the heartbeat timeout, every charge is applied exactly once, and the
queue's keys, the fleet's and the rollups' all stay on their own slots (a
script touching two slots would have failed the run).
"""

from __future__ import annotations

import os
import signal

import pytest

from tests.acceptance.test_pg_processes import all_done, assert_ledger_exact, charges, rows
from tests.support.harness import make_settings
from tests.support.waiting import wait_for


@pytest.fixture
def settings(clean_env, database_url, redis_cluster_url):
    return make_settings("redis", redis_cluster_url, database_url)


def test_charges_on_a_redis_cluster_survive_a_sigkilled_worker_exactly_once(app, workers, settings, database_url):
    group = workers("critical", processes=2)
    wait_for(lambda: len(group.child_pids()) == 2, timeout=60, message="two worker processes")
    requests = charges(120, "cluster", sleep=0.2)
    app.jobs.enqueue_many(requests)
    wait_for(
        lambda: rows(database_url, "SELECT count(*) FROM credit_entries")[0][0] >= 15,
        timeout=60,
        interval=0.05,
        message="charges running before the kill",
    )
    os.kill(group.child_pids()[0], signal.SIGKILL)
    assert rows(database_url, "SELECT count(*) FROM credit_entries")[0][0] < len(requests), "killed mid-run"
    wait_for(
        lambda: all_done(app, "critical", len(requests)), timeout=120, interval=0.2, message="every charge to be done"
    )
    assert_ledger_exact(settings, database_url, requests)
    # The kill is the one error: no script call, fleet beat or rollup flush was refused by the cluster.
    errors = [e for e in group.events() if e.get("level") == "error" and e.get("event") != "worker_died"]
    assert not errors, errors[:3]
