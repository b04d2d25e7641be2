"""The postgres broker, the ledger and the workers through PgBouncer in transaction pooling mode.

A private PgBouncer (transaction mode, Debian's 1.18: no prepared statements
across transactions) in front of this test's Postgres. Workers are real
processes with ``CONVEYOR_DATABASE_POOLED``: no prepared statements, no
session settings. With ``CONVEYOR_LISTEN_DATABASE_URL`` (a direct connection)
they are woken by NOTIFY; without it they never LISTEN (through the pooler
a notification would go to whichever client holds that server connection)
and poll. The broker contract suite runs through it too
(tests/contract, ``postgres+pgbouncer``).
"""

from __future__ import annotations

import os
import signal

import pytest

from tests.acceptance.test_pg_processes import LEASE, RECOVERY, all_done, assert_ledger_exact, charges, rows
from tests.support.harness import make_settings, probe_runs
from tests.support.waiting import wait_for


@pytest.fixture(params=["listen", "poll"])
def settings(request, clean_env, database_url, pgbouncer):
    through = pgbouncer.url(database_url.rsplit("/", 1)[1])
    return make_settings(
        "postgres",
        None,
        through,
        pg_lease_seconds=LEASE,
        pg_recovery_seconds=RECOVERY,
        pg_poll_seconds=0.5,
        database_pooled=True,
        listen_database_url=database_url if request.param == "listen" else None,
    )


def test_charges_through_pgbouncer_survive_a_sigkilled_worker_exactly_once(app, workers, settings, database_url):
    group = workers("critical", processes=2)
    wait_for(lambda: len(group.child_pids()) == 2, timeout=60, message="two worker processes")
    requests = charges(120, "bouncer", sleep=0.1)
    app.jobs.enqueue_many(requests)

    def victim():
        held = rows(
            database_url,
            "SELECT w.pid FROM conveyor_jobs j JOIN conveyor_workers w ON w.id = j.worker_id "
            "JOIN probe_runs p ON p.job_id = j.id::text AND p.pid = w.pid WHERE j.status = 'in_progress'",
        )
        return held[0][0] if held else None

    os.kill(wait_for(victim, timeout=60, interval=0.02, message="a worker running a charge"), signal.SIGKILL)
    wait_for(
        lambda: all_done(app, "critical", len(requests)), timeout=120, interval=0.2, message="every charge to be done"
    )
    assert rows(database_url, "SELECT status, count(*) FROM conveyor_jobs GROUP BY 1") == [("done", len(requests))]
    assert len(probe_runs(database_url)) >= len(requests)
    assert_ledger_exact(settings, database_url, requests)
    errors = [e for e in group.events() if e.get("level") == "error" and "prepared statement" in str(e)]
    assert not errors, errors[:3]
    # The broker never LISTENs through the pooler: its listener's connection is the direct one, or it polls.
    jobs = app.broker.jobs
    assert jobs.listens is bool(settings.listen_database_url)
    with jobs.connect_listener() as conn:
        assert conn.info.port == int(database_url.rsplit(":", 1)[1].split("/")[0]) or not jobs.listens
