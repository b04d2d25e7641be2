"""``conveyor jobs`` and ``conveyor queues``: the dashboard's operator actions from a shell, on Redis and Postgres."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from conveyor.app import App
from tests.support.brokers import SERVER_BROKERS
from tests.support.harness import ROOT, env_for
from tests.support.obs_support import SECRET, settings, worker
from tests.support.waiting import wait_for


@pytest.fixture(params=SERVER_BROKERS)
def app(request, clean_env, redis_url, database_url):
    extra = dict(pg_poll_seconds=0.5, pg_recovery_seconds=0.5, pg_lease_seconds=2)
    app = App(settings(broker=request.param, redis_url=redis_url, database_url=database_url, **extra))
    yield app
    app.close()


def conveyor(app: App, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "conveyor", *args],
        env=env_for(app.settings),
        cwd=ROOT,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_bulk_retry_and_purge_count_first_and_act_only_when_confirmed(app):
    failed = [app.jobs.enqueue("obs.work", {"n": n, "fail": True, "api_key": SECRET}).id for n in range(4)]
    done = app.jobs.enqueue("obs.work", {"n": 9}).id
    with worker(app, "indexing"):
        wait_for(lambda: app.broker.queue_counts("indexing").failed == 4, message="four jobs to fail for good")
        wait_for(lambda: app.broker.get_job(done).state == "completed", message="the fifth to complete")

    listed = conveyor(app, "jobs", "list", "--where", "queue=indexing,state=failed", "--json")
    assert listed.returncode == 0, listed.stderr
    rows = [json.loads(line) for line in listed.stdout.splitlines()]
    assert sorted(r["id"] for r in rows) == sorted(failed)
    assert SECRET not in listed.stdout  # the payload's secret field is redacted, as on the dashboard

    # Off a terminal, a bulk action says what it would do and does nothing without --yes.
    refused = conveyor(app, "jobs", "retry", "--where", "queue=indexing,job=obs.work")
    assert refused.returncode == 2
    assert "would retry 4 failed job(s) of queue indexing (obs.work); pass --yes" in refused.stderr
    assert app.broker.queue_counts("indexing").failed == 4

    retried = conveyor(app, "jobs", "retry", "--where", "queue=indexing,state=failed", "--yes")
    assert retried.returncode == 0, retried.stderr
    assert json.loads(retried.stderr.splitlines()[-1]) | {"seconds": 0} == {
        "command": "jobs retry",
        "ok": True,
        "done": 4,
        "skipped": 0,
        "seconds": 0,
    }
    assert {app.broker.get_job(i).state for i in failed} == {"waiting"}

    paused = conveyor(app, "queues", "pause", "indexing", "--json")
    assert json.loads(paused.stdout)["paused"] is True
    purged = conveyor(app, "queues", "purge", "indexing", "--yes", "--json")
    assert json.loads(purged.stdout.splitlines()[-1])["done"] == 4
    assert all(app.broker.get_job(i) is None for i in failed)
    assert json.loads(conveyor(app, "queues", "resume", "indexing", "--json").stdout)["paused"] is False

    shown = conveyor(app, "jobs", "show", done, "--json")
    assert json.loads(shown.stdout)["state"] == "completed"
    deleted = conveyor(app, "jobs", "delete", done, "--yes", "--json")
    assert json.loads(deleted.stdout.splitlines()[-1])["done"] == 1
    gone = conveyor(app, "jobs", "show", done)
    assert gone.returncode == 2 and "Traceback" not in gone.stderr


def test_a_bad_filter_is_named_without_its_value(app):
    bad = conveyor(app, "jobs", "purge", "--where", "queue=indexing,colour=s3cr3t-value", "--yes")
    assert bad.returncode == 2
    assert "--where" in bad.stderr and "s3cr3t-value" not in bad.stderr and "Traceback" not in bad.stderr
    unknown = conveyor(app, "jobs", "list", "--where", "queue=no-such-q,state=failed")
    assert (
        unknown.returncode == 2
        and "queues: agent, build, critical" in unknown.stderr
        and "Traceback" not in unknown.stderr
    )


def test_promote_runs_delayed_jobs_now_by_id_and_by_filter_even_one_a_worker_holds(app):
    held = app.jobs.enqueue("obs.work", {"n": 1}, delay=3600).id
    with worker(app, "indexing"):
        # On Redis the worker's delay consumer fetches the delayed job and holds it until its eta, an hour on.
        wait_for(lambda: app.broker.get_job(held).state == "delayed", message="the job to be delayed")
        waiting = conveyor(app, "jobs", "promote", "--where", "queue=indexing,state=failed", "--yes")
        assert waiting.returncode == 2 and "Traceback" not in waiting.stderr
        assert "this action applies to delayed jobs only" in waiting.stderr
        by_id = conveyor(app, "jobs", "promote", held, "--yes", "--json")
        assert by_id.returncode == 0, by_id.stderr
        assert json.loads(by_id.stdout.splitlines()[-1])["done"] == 1
        wait_for(lambda: app.broker.get_job(held).state == "completed", timeout=20, message="the promoted job to run")

        later = [app.jobs.enqueue("obs.work", {"n": n}, delay=3600).id for n in range(3)]
        refused = conveyor(app, "jobs", "promote", "--where", "queue=indexing")
        assert refused.returncode == 2
        assert "would promote 3 delayed job(s) of queue indexing; pass --yes" in refused.stderr
        assert app.broker.queue_counts("indexing").delayed == 3
        promoted = conveyor(app, "jobs", "promote", "--where", "queue=indexing,state=delayed", "--yes", "--json")
        assert promoted.returncode == 0, promoted.stderr
        assert json.loads(promoted.stdout.splitlines()[-1])["done"] == 3
        wait_for(
            lambda: {app.broker.get_job(i).state for i in later} == {"completed"},
            timeout=20,
            message="the promoted jobs to run",
        )
    for job_id in (held, *later):
        assert app.broker.get_job(job_id).attempts == 1  # each ran once
    again = conveyor(app, "jobs", "promote", held, "--yes", "--json")
    assert json.loads(again.stdout.splitlines()[-1]) | {"seconds": 0} == {
        "command": "jobs promote",
        "ok": True,
        "done": 0,
        "skipped": 1,
        "seconds": 0,
    }


def test_conveyor_cancel_by_id_and_where(app):
    """`conveyor cancel ID…` and `conveyor cancel --where`: waiting and delayed jobs end cancelled; an ended
    job is skipped; a state cancel does not apply to is refused with a clear message."""
    app.broker.pause_queue("indexing")
    one = app.jobs.enqueue("obs.work", {"n": 1}).id
    later = [app.jobs.enqueue("obs.work", {"n": n}, delay=3600).id for n in range(2)]
    by_id = conveyor(app, "cancel", one, "--yes", "--json")
    assert by_id.returncode == 0, by_id.stderr
    assert json.loads(by_id.stdout.splitlines()[-1])["done"] == 1
    assert app.broker.get_job(one).state == "cancelled"
    again = conveyor(app, "cancel", one, "--yes", "--json")
    assert json.loads(again.stdout.splitlines()[-1])["skipped"] == 1, "an ended job is left alone"
    bulk = conveyor(app, "cancel", "--where", "queue=indexing,state=delayed", "--yes", "--json")
    assert json.loads(bulk.stdout.splitlines()[-1])["done"] == 2
    assert {app.broker.get_job(i).state for i in later} == {"cancelled"}
    wrong = conveyor(app, "jobs", "cancel", "--where", "queue=indexing,state=failed", "--yes")
    assert wrong.returncode == 2 and "cancel applies to waiting, delayed, active" in wrong.stderr
    assert "Traceback" not in wrong.stderr
    listed = conveyor(app, "jobs", "list", "--where", "queue=indexing,state=cancelled", "--json")
    assert sorted(json.loads(line)["id"] for line in listed.stdout.splitlines()) == sorted([one, *later])
