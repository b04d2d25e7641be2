"""A final-failure hook survives the death of its worker: claimed, then marked done, run again by recovery."""

from __future__ import annotations

import os
import signal

import pytest

from tests.support.brokers import SERVER_BROKERS
from tests.support.harness import make_settings, probe_dead, probe_runs
from tests.support.waiting import wait_for


@pytest.fixture(params=SERVER_BROKERS)
def settings(request, clean_env, redis_url, database_url):
    return make_settings(request.param, redis_url, database_url)


def test_a_hook_killed_with_its_worker_runs_to_completion_on_another(app, settings, workers, database_url):
    """The job fails for good, its hook runs for seconds, the worker is SIGKILLed in it: a new worker
    finishes the hook (one more run, completed once), and the job's body never runs again."""
    first = workers("nudge")
    ref = app.jobs.enqueue("test.probe.nudge", {"token": "doomed", "permanent": True, "hook_sleep": 4})
    wait_for(lambda: probe_runs(database_url, "hook:doomed"), timeout=30, message="the hook to start")
    (pid,) = first.child_pids()
    os.kill(pid, signal.SIGKILL)
    first.terminate()
    assert probe_dead(database_url) == [], "the hook was killed before it completed"
    assert app.broker.get_job(ref.id).state != "failed", "a job is not failed before its hooks are done"

    workers("nudge")
    wait_for(lambda: probe_dead(database_url), timeout=60, message="the hook to complete on the new worker")
    record = wait_for(
        lambda: (r := app.broker.get_job(ref.id)) and r.state == "failed" and r, timeout=30, message="failed"
    )
    hooks = probe_runs(database_url, "hook:doomed")
    assert len(hooks) == 2 and hooks[0]["finished_at"] is None and hooks[1]["finished_at"] is not None
    assert hooks[0]["pid"] != hooks[1]["pid"]
    dead = probe_dead(database_url)
    assert [(d["job_id"], d["token"]) for d in dead] == [(ref.id, "doomed")], "the hook completed exactly once"
    assert "can never work" in dead[0]["error"], "the hook run again gets the job's error"
    assert len(probe_runs(database_url, "doomed")) == 1, "the body never ran again after its permanent failure"
    assert (record.attempts, app.broker.queue_counts("nudge").failed_total) == (1, 1)
