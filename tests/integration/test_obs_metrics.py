"""Prometheus metrics from real jobs: every fact counted once, across brokers and worker processes."""

from __future__ import annotations

import httpx
import pytest
from prometheus_client import generate_latest

from conveyor.app import App
from conveyor.brokers.fleet import fleet_store
from conveyor.middleware.metrics import exposition_registry
from tests.support.brokers import ALL_BROKERS
from tests.support.obs_support import CliProcess, cli_env, registry_text, running, samples, settings, value
from tests.support.obs_support import broker_app as make_app
from tests.support.servers import free_port
from tests.support.waiting import wait_for

QUEUE = "indexing"

#: Every broker this suite runs on.
JOB = "obs.work"


@pytest.fixture(params=ALL_BROKERS)
def broker_app(request):
    app = make_app(request, request.param)
    yield app
    app.close()


def test_a_jobs_life_is_counted_once_per_fact(broker_app):
    app = broker_app
    with running(app):
        done = app.jobs.enqueue(JOB, {"n": 1}, key="once")
        assert app.jobs.enqueue(JOB, {"n": 1}, key="once").deduplicated
        flaky = app.jobs.enqueue(JOB, {"n": 2, "fail_first": 2})  # two retries, then completes
        dead = app.jobs.enqueue(JOB, {"n": 3, "fail": True})  # three attempts, two retries, dead
        delayed = app.jobs.enqueue(JOB, {"n": 4}, delay=0.3)
        wait_for(
            lambda: all(
                app.broker.get_job(r.id).state in ("completed", "failed") for r in (done, flaky, dead, delayed)
            ),
            message="every job to finish",
        )
        wait_for(lambda: value(registry_text(app), "conveyor_jobs_dead_total") == 1, message="the dead count")
    data = samples(registry_text(app))
    labels = {"queue": QUEUE, "job": JOB}
    expected = {
        "conveyor_jobs_deduplicated_total": 1,
        "conveyor_jobs_started_total": 1 + 3 + 3 + 1,
        "conveyor_jobs_completed_total": 3,
        "conveyor_jobs_failed_total": 2 + 3,
        "conveyor_jobs_retried_total": 2 + 2,  # once per retry, not again when the delay queue hands it back
        "conveyor_jobs_dead_total": 1,
        "conveyor_jobs_in_flight": 0,
        "conveyor_job_run_seconds_count": 8,
        "conveyor_job_wait_seconds_count": 8,
    }
    got = {name: value(data, name, **labels) for name in expected}
    assert got == expected
    # Enqueues are the broker's count, served at scrape time; completions and final failures too.
    fleet = samples(generate_latest(exposition_registry(app)).decode())
    assert value(fleet, "conveyor_jobs_enqueued_total", **labels) == 4
    assert value(fleet, "conveyor_queue_completed_total", queue=QUEUE) == 3
    assert value(fleet, "conveyor_queue_failed_total", queue=QUEUE) == 1
    # Dramatiq's delay queue never shows up as a queue of its own.
    assert not [key for key in data if any(v.endswith(".DQ") for _, v in key[1])]
    # The delayed job's wait is counted from the end of its delay, not from its enqueue.
    assert value(data, "conveyor_job_wait_seconds_bucket", le="0.25", **labels) >= 1


def test_in_flight_and_concurrency_gauges_follow_running_jobs(redis_url):
    app = App(settings(broker="redis", redis_url=redis_url))
    try:
        with running(app, threads=3):
            assert value(registry_text(app), "conveyor_queue_concurrency", queue=QUEUE) == 3
            refs = [app.jobs.enqueue(JOB, {"n": n, "sleep": 1.0}) for n in range(2)]
            wait_for(
                lambda: value(registry_text(app), "conveyor_jobs_in_flight", queue=QUEUE) == 2,
                message="two jobs in flight",
            )
            wait_for(lambda: all(app.broker.get_job(r.id).state == "completed" for r in refs), message="done")
            assert value(registry_text(app), "conveyor_jobs_in_flight", queue=QUEUE) == 0
        assert value(registry_text(app), "conveyor_queue_concurrency", queue=QUEUE) == 0
    finally:
        app.close()


def test_ledger_consumptions_are_counted_applied_and_duplicate(redis_url, database_url):
    app = App(settings(broker="redis", redis_url=redis_url, database_url=database_url))
    charge = {"user_id": "u1", "task_id": "t1", "message_id": "m1", "total_tokens": 1000}
    try:
        with running(app, "critical"):
            first = app.jobs.enqueue("credit.consume", charge)
            # No key: a second delivery of the same charge, which the ledger must apply once.
            second = app.jobs.enqueue("credit.consume", charge)
            wait_for(
                lambda: {app.broker.get_job(r.id).state for r in (first, second)} == {"completed"},
                message="both charges to run",
            )
    finally:
        app.close()
    text = registry_text(app)
    labels = {"queue": "critical", "job": "credit.consume"}
    assert value(text, "conveyor_ledger_consumptions_total", outcome="applied", **labels) == 1
    assert value(text, "conveyor_ledger_consumptions_total", outcome="duplicate", **labels) == 1


@pytest.mark.slow
def test_metrics_from_two_worker_processes_add_up(redis_url, clean_env, tmp_path):
    port = free_port()
    metrics_dir = tmp_path / "metrics"
    metrics_dir.mkdir()
    (metrics_dir / "counter_424242.db").write_bytes(b"left over from an earlier run")
    env = cli_env(
        clean_env,
        REDIS_URL=redis_url,
        CONVEYOR_BROKER="redis",
        CONVEYOR_IMPORTS="tests.support.obs_jobs",
        CONVEYOR_METRICS_PORT=str(port),
        CONVEYOR_METRICS_HOST="127.0.0.1",
        CONVEYOR_METRICS_DIR=str(metrics_dir),
    )
    process = CliProcess(
        ["worker", "--queues", QUEUE, "--processes", "2", "--threads", "2"], env, tmp_path / "worker.log"
    )
    app = App(settings(broker="redis", redis_url=redis_url))
    url = f"http://127.0.0.1:{port}/metrics"

    def scrape() -> str:
        try:
            return httpx.get(url, timeout=5).text
        except httpx.HTTPError:
            return ""

    try:
        # Both processes up: each counts its 2 threads into the live sum.
        wait_for(
            lambda: value(scrape(), "conveyor_queue_concurrency", queue=QUEUE) == 4,
            timeout=60,
            message="two worker processes with two threads each",
        )
        assert not (metrics_dir / "counter_424242.db").exists()  # the directory was emptied at start
        refs = [app.jobs.enqueue(JOB, {"n": n, "sleep": 0.05}) for n in range(60)]
        wait_for(lambda: app.broker.queue_counts(QUEUE).completed_total == 60, timeout=60, message="60 jobs")
        # Who ran each job, from the attempt history (the broker's record forgets its worker once done).
        store = fleet_store(app)
        histories = wait_for(
            lambda: (h := [store.attempts(r.id) for r in refs]) and all(h) and h,
            timeout=30,
            message="every job's attempt in the history",
        )
        workers = {attempt.worker for history in histories for attempt in history}
        assert len(workers) == 2  # both processes ran some of them
        wait_for(
            lambda: value(scrape(), "conveyor_jobs_completed_total", queue=QUEUE) == 60, message="the summed count"
        )
        text = scrape()
        assert value(text, "conveyor_jobs_started_total", queue=QUEUE) == 60
        assert value(text, "conveyor_job_run_seconds_count", queue=QUEUE) == 60
        assert len(list(metrics_dir.glob("counter_*.db"))) == 2
    finally:
        code = process.stop()
        app.close()
    assert code == 0, process.output()[-3000:]
    assert not list(metrics_dir.glob("gauge_livesum_*.db"))  # dead processes' live gauges are dropped
