"""The queue-behaviour suite, written once and run against every broker."""

from __future__ import annotations

import threading
import time

import pytest
from dramatiq import Message

from conveyor.app import App
from tests.support.brokers import ALL_BROKERS, SERVER_BROKERS
from tests.support.harness import make_settings, peak_concurrency, probe_dead, probe_runs, running
from tests.support.waiting import wait_for


@pytest.fixture(params=ALL_BROKERS)
def app(request, clean_env, redis_url, database_url):
    app = App(make_settings(request.param, redis_url, database_url))
    yield app
    app.close()


def finished(app, job_id):
    record = app.broker.get_job(job_id)
    return record if record and record.state in ("completed", "failed") else None


def test_job_runs_once_and_is_recorded_completed(app, database_url):
    with running(app, "critical"):
        ref = app.jobs.enqueue("test.probe.critical", {"token": "ack"})
        record = wait_for(lambda: finished(app, ref.id), message="the job to finish")
    assert record.state == "completed" and record.attempts == 1
    assert [r["attempt"] for r in probe_runs(database_url, "ack")] == [1]
    assert app.broker.queue_counts("critical").completed_total == 1


def test_transient_failures_retry_with_backoff_then_succeed(app, database_url):
    with running(app, "critical"):
        ref = app.jobs.enqueue("test.probe.critical", {"token": "flaky", "fail_times": 2})
        record = wait_for(lambda: finished(app, ref.id), message="the retried job to finish")
    assert record.state == "completed" and record.attempts == 3
    runs = probe_runs(database_url, "flaky")
    assert [r["attempt"] for r in runs] == [1, 2, 3]
    gaps = [(b["started_at"] - a["started_at"]).total_seconds() for a, b in zip(runs, runs[1:])]
    assert all(gap >= 0.05 for gap in gaps), f"retries must wait at least the queue's min backoff: {gaps}"
    assert probe_dead(database_url) == []


def test_spent_attempts_fail_the_job_and_run_its_hook_once(app, database_url):
    with running(app, "nudge"):
        ref = app.jobs.enqueue("test.probe.nudge", {"token": "doomed", "fail_times": 99})
        record = wait_for(lambda: finished(app, ref.id), message="the job to fail")
        wait_for(lambda: probe_dead(database_url), message="the final-failure hook")
    max_attempts = app.queues["nudge"].max_attempts
    assert record.state == "failed" and record.attempts == max_attempts
    assert "fails on attempt" in record.error
    assert len(probe_runs(database_url, "doomed")) == max_attempts
    dead = probe_dead(database_url)
    assert [(d["job_id"], d["token"]) for d in dead] == [(ref.id, "doomed")]
    counts = app.broker.queue_counts("nudge")
    assert (counts.failed, counts.failed_total) == (1, 1)


def test_an_outage_spends_no_attempt(app, database_url):
    """A body that met conveyor's own server away (StoreUnavailable) is retried without spending an attempt:
    a restart longer than the attempts' backoff fails no job for good (the soak's DatabaseUnavailable x5)."""
    max_attempts = app.queues["nudge"].max_attempts
    outages = max_attempts + 2
    with running(app, "nudge"):
        ref = app.jobs.enqueue("test.probe.nudge", {"token": "outage", "outages": outages, "fail_times": outages + 1})
        record = wait_for(lambda: finished(app, ref.id), timeout=60, message="the job to finish")
    # The outages spent nothing; the one ordinary failure after them spent one attempt, then it completed.
    assert record.state == "completed", record.error
    assert [r["attempt"] for r in probe_runs(database_url, "outage")] == list(range(1, outages + 3))
    assert probe_dead(database_url) == []


def test_outages_past_their_allowance_spend_attempts(clean_env, redis_url, database_url):
    app = App(make_settings("inline", redis_url, database_url, outage_retries=2))
    try:
        max_attempts = app.queues["nudge"].max_attempts
        with running(app, "nudge"):
            ref = app.jobs.enqueue("test.probe.nudge", {"token": "away", "outages": 99})
            record = wait_for(lambda: finished(app, ref.id), timeout=60, message="the job to fail")
        assert record.state == "failed" and "unavailable" in record.error
        assert len(probe_runs(database_url, "away")) == 2 + max_attempts
    finally:
        app.close()


@pytest.mark.parametrize("broker", SERVER_BROKERS)
def test_a_hook_that_finds_a_store_away_runs_again_and_completes_once(broker, clean_env, redis_url, database_url):
    """A final-failure hook that raised StoreUnavailable did not finish: the job stays owned and its hooks run
    again (a finalize delivery), instead of the job ending failed with its hook's effect lost."""
    app = App(make_settings(broker, redis_url, database_url))
    try:
        with running(app, "nudge"):
            ref = app.jobs.enqueue("test.probe.nudge", {"token": "hookblip", "permanent": True, "hook_blips": 1})
            wait_for(lambda: probe_dead(database_url), timeout=60, message="the hook to complete after its blip")
            record = wait_for(lambda: finished(app, ref.id), message="the job to end failed")
        assert record.state == "failed"
        assert len(probe_runs(database_url, "blip:hookblip")) == 2, "the hook ran once more after the blip"
        assert [d["job_id"] for d in probe_dead(database_url)] == [ref.id]
        assert len(probe_runs(database_url, "hookblip")) == 1, "the body never ran again"
    finally:
        app.close()


def test_permanent_error_fails_at_once_without_retry(app, database_url):
    with running(app, "critical"):
        ref = app.jobs.enqueue("test.probe.critical", {"token": "never", "permanent": True})
        record = wait_for(lambda: finished(app, ref.id))
        wait_for(lambda: probe_dead(database_url))
    assert record.state == "failed" and record.attempts == 1
    assert record.error.startswith("PermanentError")


def test_delayed_job_waits_its_delay(app, database_url):
    with running(app, "scheduling"):
        enqueued = time.time()
        ref = app.jobs.enqueue("test.probe.scheduling", {"token": "later"}, delay=1.0)
        assert app.broker.get_job(ref.id).state == "delayed"
        wait_for(lambda: finished(app, ref.id), message="the delayed job to run")
    started = probe_runs(database_url, "later")[0]["started_at"].timestamp()
    assert started - enqueued >= 0.95


def test_same_key_enqueues_one_job_even_from_50_threads(app, database_url):
    refs, barrier = [], threading.Barrier(50)

    def enqueue():
        barrier.wait()
        refs.append(app.jobs.enqueue("test.probe.critical", {"token": "dup"}, key="credit:t1:m1"))

    threads = [threading.Thread(target=enqueue) for _ in range(50)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len({r.id for r in refs}) == 1
    assert sum(not r.deduplicated for r in refs) == 1
    with running(app, "critical"):
        wait_for(lambda: finished(app, refs[0].id))
        again = app.jobs.enqueue("test.probe.critical", {"token": "dup"}, key="credit:t1:m1")
    assert again == type(again)(refs[0].id, True), "a finished job still holds its key within the TTL"
    assert len(probe_runs(database_url, "dup")) == 1


def test_concurrency_never_exceeds_the_queue_limit(app, database_url):
    limit = app.queues["llm"].concurrency
    with running(app, "llm"):
        refs = app.jobs.enqueue_many(
            [{"job": "test.probe.llm", "payload": {"token": f"cap-{i}", "sleep": 0.3}} for i in range(8)]
        )
        wait_for(lambda: all(finished(app, r.id) for r in refs), message="all capped jobs")
    runs = probe_runs(database_url, "cap-")
    assert len(runs) == 8
    assert peak_concurrency(runs) == limit


def test_payload_that_no_longer_validates_fails_alone(app, database_url):
    # A message written by an older version: the payload misses a field this version requires.
    bad = Message(queue_name="critical", actor_name="test.probe.critical", args=({"tokn": "x"},), kwargs={}, options={})
    with running(app, "critical"):
        app.broker.enqueue(bad)
        good = app.jobs.enqueue("test.probe.critical", {"token": "after-bad"})
        wait_for(lambda: finished(app, good.id))
        record = wait_for(lambda: finished(app, bad.message_id))
    assert record.state == "failed" and record.attempts == 1
    assert "does not validate" in record.error and "token" in record.error
    assert app.broker.get_job(good.id).state == "completed"


def test_paused_queue_is_not_claimed_until_resumed(app, database_url):
    app.broker.pause_queue("indexing")
    with running(app, "indexing"):
        ref = app.jobs.enqueue("test.probe.indexing", {"token": "paused"})
        time.sleep(0.5)  # give a (wrongly) unpaused worker the chance to claim it
        assert app.broker.get_job(ref.id).state == "waiting"
        assert app.broker.queue_counts("indexing").paused
        app.broker.resume_queue("indexing")
        wait_for(lambda: finished(app, ref.id), message="the resumed queue's job")


@pytest.mark.parametrize("broker", ALL_BROKERS)
def test_time_limit_stops_a_job_that_runs_too_long(broker, clean_env, redis_url, database_url):
    app = App(
        make_settings(broker, redis_url, database_url, queues={"indexing": {"time_limit": 0.5, "max_attempts": 1}})
    )
    try:
        with running(app, "indexing"):
            ref = app.jobs.enqueue("test.probe.indexing", {"token": "slow", "sleep": 5})
            record = wait_for(lambda: finished(app, ref.id), timeout=20, message="the time limit to end the job")
        assert record.state == "failed" and "TimeLimitExceeded" in record.error
        assert probe_runs(database_url, "slow")[0]["finished_at"] is None
    finally:
        app.close()
