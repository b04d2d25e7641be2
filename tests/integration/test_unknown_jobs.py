"""Rolling deploys: a job type an older worker does not know is handed back unattempted, never failed."""

from __future__ import annotations

import pytest

from conveyor.app import App
from conveyor.brokers.base import unknown_job_error
from tests.support.brokers import SERVER_BROKERS
from tests.support.harness import make_settings, probe_runs, running
from tests.support.obs_support import registry_text, value
from tests.support.waiting import wait_for

#: Seconds before an unknown job is offered again (CONVEYOR_UNKNOWN_JOB_DELAY), short for tests.
DELAY = 0.5


@pytest.fixture(params=SERVER_BROKERS)
def settings(request, clean_env, redis_url, database_url):
    return make_settings(request.param, redis_url, database_url, unknown_job_delay=DELAY)


def _marked(app, job_id):
    record = app.broker.get_job(job_id)
    return record if record and record.error == unknown_job_error("test.probe.nudge") else None


def test_an_unknown_job_type_waits_for_a_worker_that_knows_it(app, settings, workers, database_url):
    old = workers("nudge", CONVEYOR_IMPORTS="", CONVEYOR_UNKNOWN_JOB_DELAY=str(DELAY))  # knows no test.probe.*
    ref = app.jobs.enqueue("test.probe.nudge", {"token": "new-type"})
    wait_for(lambda: len(old.events("unknown_job")) >= 3, timeout=30, message="the old worker to hand it back")
    record = _marked(app, ref.id)
    assert record is not None, "the dashboard shows why it waits"
    assert record.state in ("waiting", "delayed") and record.attempts == 0, "never attempted, never failed"
    assert app.broker.queue_counts("nudge").failed_total == 0
    event = old.events("unknown_job")[0]
    assert (event["level"], event["queue"], event["job"], event["job_id"]) == (
        "warning",
        "nudge",
        "test.probe.nudge",
        ref.id,
    )
    old.terminate()

    workers("nudge", CONVEYOR_UNKNOWN_JOB_DELAY=str(DELAY))  # the new version
    record = wait_for(
        lambda: (r := app.broker.get_job(ref.id)) and r.state == "completed" and r, timeout=30, message="it ran"
    )
    assert record.attempts == 1 and record.error is None
    assert [r["attempt"] for r in probe_runs(database_url, "new-type")] == [1]


def test_an_unknown_job_is_counted_by_queue_and_job(settings, database_url):
    old, new = App(settings), App(settings)
    try:
        del old.broker.actors["test.probe.nudge"]  # the job registry is one per process: forget it here
        ref = new.jobs.enqueue("test.probe.nudge", {"token": "counted"})
        with running(old, "nudge"):
            wait_for(lambda: _marked(new, ref.id), timeout=30, message="the unknown job to be handed back")
            count = value(registry_text(old), "conveyor_unknown_jobs_total", queue="nudge", job="test.probe.nudge")
        assert count >= 1
        assert new.broker.get_job(ref.id).attempts == 0
    finally:
        old.close()
        new.close()
