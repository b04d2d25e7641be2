"""Fair shares per group on the postgres and redis brokers, with real worker processes (issue 21.2).

The job body (``test.grouped``) counts its group's jobs running at once in the
test's own Postgres (``group_load.peak``) and records each finish
(``group_done``), so the cap and the interleaving are checked from outside
(on either broker: the job body always writes to the test's Postgres).
The scenarios run on both brokers; the CLI and validation tests on postgres.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from signal import SIGKILL

import psycopg
import pytest

from conveyor.app import App
from conveyor.errors import InvalidPayload
from tests.support.harness import FAST_QUEUES, ROOT, env_for, make_settings
from tests.support.waiting import wait_for

QUEUE = "indexing"  # test.grouped's queue: 5 threads per process
CAP = 2


BROKERS = pytest.mark.parametrize("broker_name", ["postgres", "redis"])


@pytest.fixture
def broker_name() -> str:
    return "postgres"


@pytest.fixture
def settings(clean_env, database_url, broker_name, request):
    queues = {**FAST_QUEUES, QUEUE: {**FAST_QUEUES[QUEUE], "group_concurrency": CAP}}
    redis_url = request.getfixturevalue("redis_url") if broker_name == "redis" else None
    return make_settings(broker_name, redis_url, database_url, queues=queues, pg_lease_seconds=1.5)


def rows(database_url: str, query: str, params=None) -> list[tuple]:
    with psycopg.connect(database_url, autocommit=True) as conn:
        return conn.execute(query, params).fetchall()


def done(database_url: str, grp: str) -> int:
    return rows(database_url, "SELECT count(*) FROM group_done WHERE grp = %s", (grp,))[0][0]


def jobs(grp: str | None, n: int, sleep: float = 0) -> list[dict]:
    return [{"job": "test.grouped", "payload": {"grp": grp or "-", "sleep": sleep}, "group": grp} for _ in range(n)]


@BROKERS
def test_a_small_tenant_runs_promptly_behind_a_big_tenants_backlog(app, workers, database_url):
    app.jobs.enqueue_many(jobs("tenant-a", 10_000))
    app.jobs.enqueue_many(jobs("tenant-b", 10))
    workers(QUEUE, processes=1)
    wait_for(lambda: done(database_url, "tenant-b") == 10, timeout=120, message="tenant b's ten jobs to finish")
    # Round-robin: b's ten ran between a's jobs, not after a's backlog (most of it still waits).
    assert done(database_url, "tenant-a") < 2_000, done(database_url, "tenant-a")


@BROKERS
def test_a_group_never_runs_more_than_its_cap_across_two_worker_processes(app, workers, database_url):
    app.jobs.enqueue_many(jobs("hot", 24, sleep=0.15) + jobs("warm", 8, sleep=0.15) + jobs(None, 8, sleep=0.15))
    workers(QUEUE, processes=2)  # 10 threads in all, each prefetching
    wait_for(
        lambda: done(database_url, "hot") == 24 and done(database_url, "warm") == 8,
        timeout=120,
        message="every grouped job to finish",
    )
    wait_for(lambda: done(database_url, "-") == 8, timeout=60, message="the ungrouped jobs to finish")
    peaks = dict(rows(database_url, "SELECT grp, peak FROM group_load"))
    assert peaks["hot"] == CAP and peaks["warm"] == CAP, peaks  # the cap held, and was used
    assert peaks["-"] > CAP, peaks  # jobs without a group have no cap


@BROKERS
def test_a_sigkilled_workers_slot_is_released_by_recovery(app, workers, database_url, broker_name):
    group = workers(QUEUE, processes=1)
    wait_for(lambda: len(group.child_pids()) == 1, timeout=60, message="a worker process")
    (pid,) = group.child_pids()
    app.jobs.enqueue_many(jobs("solo", 3, sleep=3))
    wait_for(
        lambda: rows(database_url, "SELECT running FROM group_load WHERE grp = 'solo'") == [(CAP,)],
        message="solo's jobs running",
    )
    if broker_name == "postgres":
        held = rows(
            database_url,
            "SELECT w.pid FROM conveyor_jobs j JOIN conveyor_workers w ON w.id = j.worker_id "
            "WHERE j.job_group = 'solo' AND j.status = 'in_progress' AND j.started_delivery = j.delivery",
        )
        assert held == [(pid,)] * CAP, held
    os.kill(pid, SIGKILL)
    # The killed runs never left group_load; the third job cannot start before recovery (both slots held).
    rows(database_url, "UPDATE group_load SET running = 0, peak = 0 WHERE grp = 'solo' RETURNING grp")
    # Recovery takes the dead worker's jobs back; their slots come free once, and all three finish.
    wait_for(lambda: done(database_url, "solo") == 3, timeout=90, message="every solo job to finish after the kill")
    wait_for(lambda: app.broker.queue_counts(QUEUE).active == 0, message="no job held after the last ack")
    # Freed once each (a double release would have let all three run at once).
    assert rows(database_url, "SELECT peak FROM group_load WHERE grp = 'solo'") == [(CAP,)]


def conveyor(settings, *args: str, stdin: str = "") -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "conveyor", *args],
        env=env_for(settings),
        cwd=ROOT,
        input=stdin,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_cli_enqueue_takes_a_group_and_the_batch_a_group_field(settings, database_url):
    one = conveyor(settings, "enqueue", "test.grouped", "--payload", '{"grp": "x"}', "--group", "user:42")
    assert one.returncode == 0, one.stderr
    lines = "\n".join(json.dumps(j) for j in jobs("user:7", 2) + jobs(None, 1))
    batch = conveyor(settings, "enqueue", "--batch", stdin=lines)
    assert batch.returncode == 0, batch.stderr
    got = rows(database_url, "SELECT job_group, count(*) FROM conveyor_jobs GROUP BY 1 ORDER BY 1")
    assert got == [("", 1), ("user:42", 1), ("user:7", 2)]
    # The admin views show the group; queue counts are as before.
    app = App(settings)
    try:
        assert app.jobs.get(json.loads(one.stdout)["id"]).group == "user:42"
        assert {j.group for j in app.broker.list_jobs(QUEUE, "waiting", limit=10, offset=0)} == {
            "user:42",
            "user:7",
            None,
        }
        assert app.broker.queue_counts(QUEUE).waiting == 4
    finally:
        app.close()


@pytest.mark.parametrize("bad", ["", "x" * 129, "tab\there", "new\nline"])
def test_a_bad_group_is_refused_without_echoing_it(app, settings, bad):
    with pytest.raises(InvalidPayload) as raised:
        app.jobs.enqueue("test.grouped", {"grp": "x"}, group=bad)
    assert "group" in str(raised.value) and (not bad or bad not in str(raised.value))
    cli = conveyor(settings, "enqueue", "test.grouped", "--payload", '{"grp": "x"}', "--group", bad)
    assert cli.returncode != 0 and "printable" in cli.stderr and "Traceback" not in cli.stderr
    if bad:
        assert bad not in cli.stderr


@BROKERS
def test_cli_queues_weight_sets_a_groups_weight_and_refuses_a_bad_one(settings, broker_name):
    done_ = conveyor(settings, "queues", "weight", QUEUE, "org/42", "3", "--json")
    assert done_.returncode == 0, done_.stderr
    assert json.loads(done_.stdout) == {"queue": QUEUE, "weights": {"org/42": 3}}
    for bad in (["org/42", "0"], ["org/42", "1001"], ["x7f3\there", "2"]):
        refused = conveyor(settings, "queues", "weight", QUEUE, *bad)
        assert refused.returncode != 0 and "Traceback" not in refused.stderr, refused.stderr
        assert "weight" in refused.stderr and "x7f3" not in refused.stderr
    unknown = conveyor(settings, "queues", "weight", "nosuch", "g", "2")
    assert unknown.returncode != 0 and "Traceback" not in unknown.stderr
    app = App(settings)
    try:
        assert app.jobs.group_weights(QUEUE) == {"org/42": 3}
    finally:
        app.close()
