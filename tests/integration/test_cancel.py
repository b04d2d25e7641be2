"""Cancel a running job in another worker process (issue 21 item 1), on Redis and Postgres.

The job sees ``ctx.cancelled`` at once; a job that ignores it is interrupted within a second of the
grace (``CONVEYOR_CANCEL_GRACE_SECONDS``); its cancel hook runs once; it ends ``cancelled``, counted
as neither completed nor failed, and no final-failure hook or webhook runs. The latencies are printed
(``-s``) for the closing note.
"""

from __future__ import annotations

import time

import psycopg
import pytest

from conveyor.backends import BACKENDS
from conveyor.brokers.base import CancelOutcome
from tests.support.brokers import SERVER_BROKERS
from tests.support.harness import make_settings
from tests.support.waiting import wait_for

GRACE = 1.0


#: The brokers whose class completes a job inside the job's own transaction (its capability).
TRANSACTIONAL = [b for b in SERVER_BROKERS if BACKENDS[b].capabilities.transactional_completion]


@pytest.fixture(params=SERVER_BROKERS)
def settings(request, clean_env, redis_url, database_url):
    return make_settings(request.param, redis_url, database_url, cancel_grace_seconds=GRACE)


def _steps(database_url: str, token: str) -> dict[str, list[float]]:
    with psycopg.connect(database_url) as conn:
        rows = conn.execute(
            "SELECT kind, extract(epoch FROM at)::float8 FROM effect_log WHERE token = %s ORDER BY id", (token,)
        ).fetchall()
    out: dict[str, list[float]] = {}
    for kind, at in rows:
        out.setdefault(kind, []).append(at)
    return out


def _ended(app, job_id: str, state: str = "cancelled"):
    return wait_for(
        lambda: (r := app.broker.get_job(job_id)) and r.state == state and r, timeout=60, message=f"job {state}"
    )


def test_a_running_job_that_ignores_the_cancel_is_interrupted_after_the_grace(app, settings, workers, database_url):
    workers("nudge", CONVEYOR_CANCEL_GRACE_SECONDS=str(GRACE))
    ref = app.jobs.enqueue("test.cancellable", {"token": "stubborn"})
    wait_for(lambda: "started" in _steps(database_url, "stubborn"), timeout=30, message="the job to start")
    asked = time.time()
    assert app.jobs.cancel(ref.id) == CancelOutcome.REQUESTED
    record = _ended(app, ref.id)
    steps = _steps(database_url, "stubborn")
    seen, stopped = steps["seen"][0] - asked, steps["interrupted"][0] - asked
    print(
        f"\n[{settings.broker_name}] ignored cancel: seen after {seen * 1000:.0f} ms, "
        f"interrupted after {stopped * 1000:.0f} ms (grace {GRACE:.0f} s)"
    )
    assert seen < 1.0, "ctx.cancelled within a second of the cancel"
    assert GRACE <= stopped < GRACE + 1.0, "interrupted within a second of the grace's end"
    assert len(steps["hook"]) == 1, "the cancel hook runs once"
    assert steps["hook"][0] >= steps["interrupted"][0]
    assert record.attempts == 1 and record.state == "cancelled"
    counts = app.broker.queue_counts("nudge")
    assert (counts.failed, counts.failed_total, counts.completed_total, counts.cancelled) == (0, 0, 0, 1)
    assert app.jobs.cancel(ref.id) == CancelOutcome.FINISHED
    history = wait_for(
        lambda: [a.outcome for a in app.jobs.get(ref.id).history] == ["cancelled"] or None,
        timeout=20,
        message="the attempt's history to say cancelled",
    )
    assert history


def test_a_cooperative_job_stops_by_itself_and_ends_cancelled(app, settings, workers, database_url):
    workers("nudge", CONVEYOR_CANCEL_GRACE_SECONDS=str(GRACE))
    ref = app.jobs.enqueue("test.cancellable", {"token": "polite", "cooperative": True})
    wait_for(lambda: "started" in _steps(database_url, "polite"), timeout=30, message="the job to start")
    asked = time.time()
    assert app.jobs.cancel(ref.id) == CancelOutcome.REQUESTED
    _ended(app, ref.id)
    steps = _steps(database_url, "polite")
    print(f"\n[{settings.broker_name}] cooperative cancel: stopped after {(steps['stopped'][0] - asked) * 1000:.0f} ms")
    assert steps["stopped"][0] - asked < 1.0
    assert "interrupted" not in steps and len(steps["hook"]) == 1


@pytest.mark.parametrize("settings", TRANSACTIONAL, indirect=True)
def test_a_job_whose_own_transaction_completed_it_after_the_cancel_stays_done_without_the_hook(
    app, settings, workers, database_url
):
    """Found by the fault campaign (issues 18/21): a body that commits its job done in its own transaction
    (ctx.transaction) after the cancel was asked leaves it done; the cancel hook, which undoes a cancelled
    run's work, must not run for it."""
    workers("nudge", CONVEYOR_CANCEL_GRACE_SECONDS=str(GRACE))
    ref = app.jobs.enqueue("test.cancellable", {"token": "committed", "commit": True})
    wait_for(lambda: "started" in _steps(database_url, "committed"), timeout=30, message="the job to start")
    assert app.jobs.cancel(ref.id) == CancelOutcome.REQUESTED
    _ended(app, ref.id, "completed")
    time.sleep(0.5)  # the middleware's after-run step, where the hook would run, follows the commit at once
    steps = _steps(database_url, "committed")
    assert len(steps["committed"]) == 1 and "hook" not in steps, steps
    assert app.broker.get_job(ref.id).state == "completed"


@pytest.mark.parametrize("settings", TRANSACTIONAL, indirect=True)
def test_a_job_whose_own_complete_in_transaction_completed_it_after_the_cancel_stays_done_without_the_hook(
    app, settings, workers, database_url
):
    """Review of 6167b10: the same as above through ``ctx.complete_in(conn)`` in a transaction the body makes
    itself (documented as equivalent): the job is done, yet the cancel hook still runs (only ctx.transaction
    marks the message completed)."""
    workers("nudge", CONVEYOR_CANCEL_GRACE_SECONDS=str(GRACE))
    ref = app.jobs.enqueue("test.cancellable", {"token": "committed-own", "complete_in": True})
    wait_for(lambda: "started" in _steps(database_url, "committed-own"), timeout=30, message="the job to start")
    assert app.jobs.cancel(ref.id) == CancelOutcome.REQUESTED
    _ended(app, ref.id, "completed")
    time.sleep(0.5)  # the middleware's after-run step, where the hook would run, follows the commit at once
    steps = _steps(database_url, "committed-own")
    assert len(steps["committed"]) == 1 and "hook" not in steps, steps
    assert app.broker.get_job(ref.id).state == "completed"


def test_a_waiting_job_cancelled_before_any_worker_runs_never_starts(app, settings, workers, database_url):
    ref = app.jobs.enqueue("test.cancellable", {"token": "never"})
    delayed = app.jobs.enqueue("test.cancellable", {"token": "never-delayed"}, delay=2)
    assert app.jobs.cancel(ref.id) == CancelOutcome.CANCELLED
    assert app.jobs.cancel(delayed.id) == CancelOutcome.CANCELLED
    workers("nudge")
    canary = app.jobs.enqueue("test.probe.nudge", {"token": "canary"})
    _ended(app, canary.id, "completed")
    time.sleep(2.5)  # past the delayed one's eta
    assert _steps(database_url, "never") == {} and _steps(database_url, "never-delayed") == {}
    assert app.broker.get_job(ref.id).state == "cancelled"
    assert app.broker.get_job(delayed.id).state == "cancelled"


def test_a_cancel_asked_while_the_worker_is_down_holds_after_its_restart(app, settings, workers, database_url):
    first = workers("nudge")
    ref = app.jobs.enqueue("test.cancellable", {"token": "restart"})
    wait_for(lambda: "started" in _steps(database_url, "restart"), timeout=30, message="the job to start")
    import os
    import signal

    for pid in first.child_pids():
        os.kill(pid, signal.SIGKILL)
    first.terminate()
    assert app.jobs.cancel(ref.id) == CancelOutcome.REQUESTED  # held by a dead worker: stored
    workers("nudge")
    _ended(app, ref.id)
    steps = _steps(database_url, "restart")
    assert len(steps["started"]) == 1, "after the restart it never ran again"


@pytest.mark.parametrize("broker", ["inline"])
def test_inline_a_running_job_is_interrupted_and_counted(broker, clean_env, database_url, monkeypatch):
    """The inline broker (one process): the same cancel, heard in memory; the metric counts it."""
    from conveyor.app import App
    from conveyor.middleware.metrics import find_metrics
    from tests.support.harness import running

    monkeypatch.setenv("DATABASE_URL", database_url)  # test.cancellable writes its steps there
    app = App(make_settings("inline", None, database_url, cancel_grace_seconds=0.2))
    try:
        with running(app, "nudge"):
            ref = app.jobs.enqueue("test.cancellable", {"token": "inline"})
            wait_for(lambda: "started" in _steps(database_url, "inline"), timeout=30, message="the job to start")
            assert app.jobs.cancel(ref.id) in (CancelOutcome.REQUESTED,)
            _ended(app, ref.id)
            steps = _steps(database_url, "inline")
            assert "interrupted" in steps and len(steps["hook"]) == 1
            metrics = find_metrics(app.broker)
            assert metrics is not None
            assert metrics.cancelled.labels("nudge", "test.cancellable")._value.get() == 1
            waiting = [app.jobs.enqueue("test.cancellable", {"token": f"w{n}"}, delay=60).id for n in range(3)]
            assert app.jobs.cancel_where(queue="nudge", job="test.cancellable") == 3
            assert {app.broker.get_job(i).state for i in waiting} == {"cancelled"}
    finally:
        app.close()
