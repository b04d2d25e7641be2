"""Worker processes for real: SIGKILL, crash loops, SIGTERM drains, and 10,000 charges.

These run on the brokers that persist jobs across processes. The inline
broker lives inside one process, so none of this can apply to it.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
from decimal import Decimal

import psutil
import psycopg
import pytest

from conveyor.app import App
from conveyor.ledger import credits
from conveyor.settings import QueueOverride
from tests.support.brokers import SERVER_BROKERS
from tests.support.harness import ROOT, WorkerProcess, env_for, make_settings, probe_dead, probe_runs
from tests.support.jobs import flaky
from tests.support.waiting import wait_for


@pytest.fixture(params=SERVER_BROKERS)
def settings(request, clean_env, redis_url, database_url):
    return make_settings(request.param, redis_url, database_url)


def ledger(database_url):
    with psycopg.connect(database_url) as conn:
        entries = conn.execute("SELECT count(*) FROM credit_entries").fetchone()[0]
        return entries, credits.verify(conn)


def test_sigkilled_worker_job_completes_elsewhere_and_charges_once(app, workers, database_url):
    first = workers("critical")
    child = wait_for(lambda: first.child_pids(), message="the first worker to start")[0]
    # ps and top name each process for its role and queues, not `python -c from multiprocessing...`.
    assert psutil.Process(child).cmdline()[0].startswith("conveyor worker: critical")
    assert psutil.Process(first.proc.pid).cmdline()[0].startswith("conveyor supervisor: critical")
    ref = app.jobs.enqueue(
        "test.slow_credit",
        {"user_id": "u1", "task_id": "t1", "message_id": "m1", "total_tokens": 1000, "sleep": 2.0},
        key="credit:t1:m1",
    )
    run = wait_for(lambda: probe_runs(database_url, "m1"), message="the charge to start")[0]
    os.kill(run["pid"], signal.SIGKILL)
    first.terminate()
    second = workers("critical")
    wait_for(
        lambda: app.broker.get_job(ref.id).state == "completed",
        timeout=60,
        message="the killed worker's job to complete on another worker",
    )
    assert second.events("stalled"), "the recovery pass should log the stalled job"
    with psycopg.connect(database_url) as conn:
        assert credits.balance(conn, "u1") == Decimal("-0.002")
    assert ledger(database_url) == (1, [])
    assert [r["attempt"] for r in probe_runs(database_url, "m1")] == [1, 2]


def test_crash_looping_job_fails_after_max_attempts_and_others_still_run(settings, tmp_path, database_url):
    queues = {**settings.queues, "nudge": QueueOverride(max_attempts=3, min_backoff=0.05, max_backoff=0.2)}
    settings = settings.model_copy(update={"queues": queues})
    app = App(settings)
    worker = WorkerProcess(settings, "nudge", log=tmp_path / "crash.log")
    try:
        _crash_loop(app, worker, database_url)
    finally:
        worker.terminate()
        app.close()


def _crash_loop(app, worker, database_url):
    crasher = app.jobs.enqueue("test.probe.nudge", {"token": "crasher", "crash_times": 1000})
    wait_for(
        lambda: app.broker.get_job(crasher.id).state == "failed",
        timeout=90,
        message="the crash-looping job to be failed",
    )
    record = app.broker.get_job(crasher.id)
    # Redis finds the spent budget when the job starts once more; Postgres's
    # recovery pass finds it before handing the job out again.
    max_attempts = app.queues["nudge"].max_attempts
    assert max_attempts <= record.attempts <= max_attempts + 1
    assert record.error.startswith("WorkerLost")
    # On Postgres the recovery pass marks the job failed first and runs the hook just after: wait for it.
    wait_for(
        lambda: [d["token"] for d in probe_dead(database_url)] == ["crasher"],
        timeout=10,
        message="the final-failure hook",
    )
    assert len(worker.events("worker_died")) >= max_attempts
    healthy = app.jobs.enqueue("test.probe.nudge", {"token": "healthy"})
    wait_for(
        lambda: app.broker.get_job(healthy.id).state == "completed",
        timeout=30,
        message="the restarted worker group to serve other jobs",
    )


def test_sigterm_lets_in_flight_jobs_finish_and_loses_none(app, workers, database_url):
    worker = workers("llm")
    wait_for(lambda: worker.child_pids())
    refs = app.jobs.enqueue_many(
        [{"job": "test.probe.llm", "payload": {"token": f"drain-{i}", "sleep": 1.5}} for i in range(6)]
    )
    wait_for(lambda: len(probe_runs(database_url, "drain-")) >= 2, message="two jobs in flight")
    assert worker.terminate() == 0
    runs = probe_runs(database_url, "drain-")
    assert runs and all(r["finished_at"] is not None for r in runs), "in-flight jobs must finish"
    waiting = [r for r in refs if app.broker.get_job(r.id).state == "waiting"]
    assert len(runs) + len(waiting) == 6, "prefetched jobs go back to the queue"
    workers("llm")
    wait_for(lambda: all(app.broker.get_job(r.id).state == "completed" for r in refs), timeout=60)
    tokens = [r["token"] for r in probe_runs(database_url, "drain-")]
    assert sorted(tokens) == sorted(f"drain-{i}" for i in range(6)), "no job ran twice, none lost"


def test_ten_thousand_charges_with_duplicates_and_transient_failures_are_exact(app, workers, database_url, settings):
    rng = random.Random(7)
    unique = [(f"user-{i % 50}", f"task-{i}", f"msg-{i}", rng.randint(1, 5000)) for i in range(8000)]
    repeats = [rng.choice(unique) for _ in range(2000)]  # 20 % of the jobs repeat a key
    jobs = unique + repeats
    rng.shuffle(jobs)
    for _ in range(3):
        workers("critical", TEST_FLAKY_CREDIT_PERCENT="10")
    requests = [
        {
            "job": "credit.consume",
            "key": f"credit:{t}:{m}",
            "payload": {"user_id": u, "task_id": t, "message_id": m, "total_tokens": n},
        }
        for u, t, m, n in jobs
    ]
    deduplicated = 0
    for start in range(0, len(requests), 500):
        deduplicated += sum(r.deduplicated for r in app.jobs.enqueue_many(requests[start : start + 500]))
    assert deduplicated == len(repeats)

    def done():
        counts = app.broker.queue_counts("critical")
        return counts.completed_total >= len(unique) and counts.waiting + counts.active + counts.delayed == 0

    wait_for(done, timeout=240, interval=0.5, message="all charges to be processed")
    counts = app.broker.queue_counts("critical")
    assert counts.failed_total == 0
    entries, mismatches = ledger(database_url)
    assert entries == len(unique) and mismatches == []
    expected: dict[str, Decimal] = {}
    for user, _, _, tokens in unique:
        expected[user] = expected.get(user, Decimal(0)) - credits.cost(tokens, settings.price_per_1k_tokens)
    with psycopg.connect(database_url) as conn:
        actual = dict(conn.execute("SELECT user_id, balance FROM credit_accounts").fetchall())
    assert actual == expected
    retried = sum(flaky(t, 10) for _, t, _, _ in unique)
    assert retried > 500, "about 10 % of the charges must have failed once and been retried"
    verify = subprocess.run(
        [sys.executable, "-m", "conveyor", "ledger", "verify"],
        env=env_for(settings),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert verify.returncode == 0, verify.stderr
    assert f"{entries} entries, 0 mismatches" in verify.stdout
