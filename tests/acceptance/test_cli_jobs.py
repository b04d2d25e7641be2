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
    assert unknown.returncode == 2 and "queues: agent, critical" in unknown.stderr and "Traceback" not in unknown.stderr
