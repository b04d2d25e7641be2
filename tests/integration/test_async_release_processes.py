"""Async jobs in flight in a ``conveyor worker`` process (issue 21.7), on Redis and Postgres: a SIGTERM drains
them (they finish and are acked, the process exits 0), a drain that runs out of time leaves them held (none
acked early) and the next worker runs them, and a SIGKILL mid-await loses none: recovery runs each again."""

from __future__ import annotations

import os
import signal

import pytest

from tests.support.brokers import SERVER_BROKERS
from tests.support.harness import make_settings, probe_runs
from tests.support.waiting import wait_for

IMPORTS = "tests.support.jobs,tests.support.async_jobs"
N = 30


@pytest.fixture(params=SERVER_BROKERS)
def settings(request, clean_env, redis_url, database_url):
    return make_settings(request.param, redis_url, database_url, imports=IMPORTS)


def _enqueue(app, prefix: str, sleep: float) -> list[str]:
    return [app.jobs.enqueue("test.aprobe", {"token": f"{prefix}{i:02d}", "sleep": sleep}).id for i in range(N)]


def _all_started(database_url: str, prefix: str) -> None:
    wait_for(lambda: len(probe_runs(database_url, prefix)) >= N, timeout=60, message=f"{N} coroutines started")


def _states(app, ids: list[str]) -> list[str]:
    return sorted({app.broker.get_job(i).state for i in ids})


def _all_completed(app, ids: list[str]) -> None:
    wait_for(lambda: _states(app, ids) == ["completed"], timeout=90, message="every job completed")


def test_a_sigterm_lets_the_awaiting_jobs_finish_and_acks_them(app, workers, database_url):
    worker = workers("aio_proc")
    ids = _enqueue(app, "term", 2.0)
    _all_started(database_url, "term")
    assert worker.terminate() == 0
    runs = probe_runs(database_url, "term")
    assert len(runs) == N and all(r["finished_at"] is not None for r in runs), "each ran once, to its end"
    assert _states(app, ids) == ["completed"], "and was acked before the process exited"


def test_a_drain_out_of_time_leaves_the_jobs_held_and_the_next_worker_runs_them(app, workers, database_url):
    worker = workers("aio_proc", CONVEYOR_SHUTDOWN_TIMEOUT="1")
    ids = _enqueue(app, "late", 6.0)
    _all_started(database_url, "late")
    worker.terminate()
    assert "completed" not in _states(app, ids), "none acked before its coroutine ended"
    assert app.broker.queue_counts("aio_proc").completed_total == 0
    workers("aio_proc")
    _all_completed(app, ids)
    runs = probe_runs(database_url, "late")
    finished = [r["token"] for r in runs if r["finished_at"] is not None]
    assert sorted(finished) == sorted(f"late{i:02d}" for i in range(N)), "each finished once, on the new worker"


def test_a_sigkill_mid_await_loses_no_job(app, workers, database_url):
    first = workers("aio_proc")
    ids = _enqueue(app, "kill", 3.0)
    _all_started(database_url, "kill")
    (pid,) = first.child_pids()
    os.kill(pid, signal.SIGKILL)
    first.terminate()
    assert "completed" not in _states(app, ids)
    workers("aio_proc")
    _all_completed(app, ids)
    runs = probe_runs(database_url, "kill")
    assert len(runs) == 2 * N, "each ran once more, after the recovery"
    assert sorted(r["token"] for r in runs if r["finished_at"] is not None) == sorted(f"kill{i:02d}" for i in range(N))
    assert {app.broker.get_job(i).attempts for i in ids} == {2}
