"""The Postgres broker with real worker processes: SIGKILL mid-batch, and Postgres restarting under them.

Charges go through the credit ledger, so "done exactly once" is checked
where it matters: one ledger entry per reference, balances equal to the
sum of entries (``conveyor ledger verify``), however often a job ran.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import psycopg
import pytest

from conveyor.ledger import credits
from tests.support.harness import ROOT, env_for, make_settings, probe_runs
from tests.support.waiting import wait_for

#: Short lease and recovery interval, so a dead worker's jobs come back within seconds.
LEASE = 1.5
RECOVERY = 0.5


@pytest.fixture
def settings(clean_env, database_url):
    return make_settings("postgres", None, database_url, pg_lease_seconds=LEASE, pg_recovery_seconds=RECOVERY)


def charges(n: int, prefix: str, sleep: float) -> list[dict]:
    return [
        {
            "job": "test.slow_credit",
            "key": f"credit:{prefix}-{i}:m-{i}",
            "payload": {
                "user_id": f"user-{i % 7}",
                "task_id": f"{prefix}-{i}",
                "message_id": f"m-{i}",
                "total_tokens": 100 + i,
                "sleep": sleep,
            },
        }
        for i in range(n)
    ]


def rows(database_url: str, query: str, params=None) -> list[tuple]:
    with psycopg.connect(database_url, autocommit=True) as conn:
        return conn.execute(query, params).fetchall()


def assert_ledger_exact(settings, database_url: str, requests: list[dict]) -> None:
    references = {credits.consume_reference(r["payload"]["task_id"], r["payload"]["message_id"]) for r in requests}
    entries = rows(database_url, "SELECT reference_id FROM credit_entries")
    assert sorted(e[0] for e in entries) == sorted(references), "one ledger entry per charge, none twice"
    expected: dict[str, object] = {}
    for r in requests:
        p = r["payload"]
        expected[p["user_id"]] = expected.get(p["user_id"], 0) - credits.cost(
            p["total_tokens"], settings.price_per_1k_tokens
        )
    assert dict(rows(database_url, "SELECT user_id, balance FROM credit_accounts")) == expected
    verify = subprocess.run(
        [sys.executable, "-m", "conveyor", "ledger", "verify"],
        env=env_for(settings),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert verify.returncode == 0, verify.stderr
    assert f"{len(references)} entries, 0 mismatches" in verify.stdout


def all_done(app, queue: str, total: int):
    counts = app.broker.queue_counts(queue)
    return counts.completed_total == total and counts.waiting + counts.delayed + counts.active == 0


def test_sigkilled_worker_mid_batch_its_jobs_come_back_within_the_lease_and_charge_once(
    app, workers, settings, database_url
):
    group = workers("critical", processes=3)
    wait_for(lambda: len(group.child_pids()) == 3, timeout=60, message="three worker processes")
    requests = charges(240, "kill", sleep=0.5)
    app.jobs.enqueue_many(requests)

    def victim():
        """A worker holding a batch, some of it running."""
        # Running means its charge has begun: the probe row the job writes first is there.
        held = rows(
            database_url,
            "SELECT w.pid, w.id, count(*), count(p.id) FROM conveyor_jobs j "
            "JOIN conveyor_workers w ON w.id = j.worker_id "
            "LEFT JOIN probe_runs p ON p.job_id = j.id::text AND p.pid = w.pid "
            "WHERE j.status = 'in_progress' GROUP BY w.pid, w.id ORDER BY 3 DESC",
        )
        return next((h for h in held if h[2] >= 5 and h[3] >= 2), None)

    pid, worker_id, _, _ = wait_for(victim, message="a worker holding a batch")
    os.kill(pid, signal.SIGKILL)
    killed_at = time.monotonic()
    stranded = [r[0] for r in rows(database_url, "SELECT id FROM conveyor_jobs WHERE worker_id = %s", (worker_id,))]
    assert stranded, "the killed worker held jobs"

    wait_for(
        lambda: not rows(database_url, "SELECT 1 FROM conveyor_jobs WHERE worker_id = %s", (worker_id,)),
        timeout=30,
        interval=0.02,
        message="the killed worker's jobs to be recovered",
    )
    recovered_in = time.monotonic() - killed_at
    # Lease, then at most one recovery interval (plus the maintenance tick and a slow CI's slack).
    assert recovered_in <= LEASE + RECOVERY + settings.maintenance_interval + 2.0, recovered_in

    wait_for(
        lambda: all_done(app, "critical", len(requests)), timeout=90, interval=0.2, message="every charge to be done"
    )
    assert rows(database_url, "SELECT status, count(*) FROM conveyor_jobs GROUP BY 1") == [("done", len(requests))]
    runs = [r["job_id"] for r in probe_runs(database_url)]
    assert any(runs.count(job_id) == 2 for job_id in stranded), "some jobs were killed mid-run and ran again"
    assert_ledger_exact(settings, database_url, requests)
    assert any(e["job_id"] in stranded for e in group.events("stalled")), "recovery logs what it took back"


def test_postgres_restart_under_running_workers_loses_no_job(app, workers, settings, database_url, pg_server):
    group = workers("critical", processes=2)
    wait_for(lambda: len(group.child_pids()) == 2, timeout=60, message="two worker processes")
    requests = charges(400, "restart", sleep=0.02)
    app.jobs.enqueue_many(requests)
    wait_for(lambda: app.broker.queue_counts("critical").completed_total >= 60, timeout=60, message="work under way")

    pg_server.restart()

    wait_for(
        lambda: all_done(app, "critical", len(requests)),
        timeout=120,
        interval=0.2,
        message="the workers to reconnect and finish every charge",
    )
    assert rows(database_url, "SELECT status, count(*) FROM conveyor_jobs GROUP BY 1") == [("done", len(requests))]
    assert_ledger_exact(settings, database_url, requests)
    # A worker whose heartbeat stays away for most of the 1.5 s lease exits (the self-fence, exit 75)
    # and its supervisor starts a fresh one; a faster restart is ridden out by the listener.
    # Either way every worker came back to the restarted server on its own.
    assert group.events("reconnected") or group.events("self_fence"), "the workers' listeners reconnected"
    wait_for(lambda: len(group.child_pids()) == 2, timeout=30, message="both worker processes up after the restart")
