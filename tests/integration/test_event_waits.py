"""Waiting for an event (issue 21, item 5) on Redis and on Postgres, with real worker processes.

``ctx.wait_for(name, timeout)`` parks the job (state ``awaiting``, no attempt spent, no
thread held); ``app.events.signal(name, data)`` resumes it exactly once with the data, a
signal sent before the wait is kept, and the timeout resumes it with None (or WaitTimeout).
Each run of the job body is a row of ``wait_runs`` (tests/support/wait_jobs.py).
"""

from __future__ import annotations

import json
import tempfile
import threading
import time

import psycopg
import pytest

from conveyor.app import App
from conveyor.errors import StoreUnavailable
from tests.support import wait_jobs
from tests.support.brokers import SERVER_BROKERS
from tests.support.harness import WorkerProcess, make_settings, running
from tests.support.servers import RedisServer
from tests.support.waiting import wait_for


@pytest.fixture(params=SERVER_BROKERS)
def settings(request, clean_env, database_url):
    redis_url = request.getfixturevalue("redis_url") if request.param == "redis" else None
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(wait_jobs.TABLE)
    return make_settings(request.param, redis_url, database_url, imports="tests.support.wait_jobs")


def runs(database_url: str, token: str) -> list[tuple[str, str, object, int]]:
    """(job id, phase, data, attempt) of every run of ``token``'s jobs, in order."""
    with psycopg.connect(database_url) as conn:
        rows = conn.execute(
            "SELECT job_id, phase, data, attempt FROM wait_runs WHERE token = %s ORDER BY id", (token,)
        ).fetchall()
    return [(job_id, phase, json.loads(data) if data else None, attempt) for job_id, phase, data, attempt in rows]


def phases(database_url: str, token: str) -> list[str]:
    return [phase for _, phase, _, _ in runs(database_url, token)]


def awaiting(app: App, job_id: str) -> None:
    wait_for(lambda: app.jobs.get(job_id).state == "awaiting", timeout=30, message="the job to await its event")


def completed(app: App, job_id: str) -> None:
    wait_for(lambda: _state(app, job_id) == "completed", timeout=30, message="the job to complete")


def _state(app: App, job_id: str) -> str | None:
    try:
        return app.jobs.get(job_id).state
    except StoreUnavailable:  # a pooled connection the restart broke: the next one is fresh
        return None


def test_a_signal_after_the_wait_resumes_the_job_once_with_its_data(app: App, workers, database_url):
    workers("waits")
    ref = app.jobs.enqueue("test.wait.waiter", {"token": "after", "event": "approval:run-1"})
    awaiting(app, ref.id)
    record = app.broker.get_job(ref.id)
    assert record.event == "approval:run-1" and record.attempts == 1
    assert app.broker.queue_counts("waits").awaiting == 1
    sent = time.monotonic()
    assert app.events.signal("approval:run-1", {"approved": True}) == 1
    completed(app, ref.id)
    print(f"signal to completed on {app.settings.broker_name}: {time.monotonic() - sent:.3f} s")
    assert runs(database_url, "after") == [
        (ref.id, "start", None, 1),
        (ref.id, "start", None, 2),
        (ref.id, "resumed", {"approved": True}, 2),
    ]
    assert app.events.signal("approval:run-1", {"approved": False}) == 0, "resumed already: nothing to resume"
    time.sleep(1)
    assert phases(database_url, "after").count("resumed") == 1


def test_a_cancelled_awaiting_job_never_resumes(app: App, workers, database_url):
    """Cancel (issue 21, item 1) reaches a parked job: it ends cancelled, and its event no longer resumes it."""
    workers("waits")
    ref = app.jobs.enqueue("test.wait.waiter", {"token": "cancelled", "event": "approval:run-9"})
    awaiting(app, ref.id)
    assert app.jobs.cancel(ref.id) == "cancelled"
    assert app.jobs.get(ref.id).state == "cancelled"
    assert app.broker.queue_counts("waits").awaiting == 0
    assert app.events.signal("approval:run-9", "late") == 0, "a cancelled job is nobody's waiter"
    time.sleep(1.5)
    assert app.jobs.get(ref.id).state == "cancelled"
    assert phases(database_url, "cancelled") == ["start"], "the body never ran again"


def test_a_signal_before_the_wait_is_not_lost(app: App, workers, database_url):
    assert app.events.signal("approval:run-2", "yes") == 0
    workers("waits")
    ref = app.jobs.enqueue("test.wait.waiter", {"token": "before", "event": "approval:run-2"})
    completed(app, ref.id)
    assert runs(database_url, "before") == [(ref.id, "start", None, 1), (ref.id, "resumed", "yes", 1)]


def test_the_timeout_resumes_the_wait_with_none_or_raises(app: App, workers, database_url):
    workers("waits")
    quiet = app.jobs.enqueue("test.wait.waiter", {"token": "timeout", "event": "never:1", "timeout": 1.0})
    loud = app.jobs.enqueue(
        "test.wait.waiter", {"token": "raised", "event": "never:2", "timeout": 1.0, "raise_on_timeout": True}
    )
    completed(app, quiet.id)
    completed(app, loud.id)
    assert [(p, d) for _, p, d, _ in runs(database_url, "timeout")] == [
        ("start", None),
        ("start", None),
        ("resumed", None),
    ]
    assert phases(database_url, "raised") == ["start", "start", "timeout"]
    assert app.events.signal("never:1", 1) == 0, "timed out already: a late signal resumes nothing"


def test_two_concurrent_signals_resume_the_job_once(app: App, workers, database_url, settings):
    workers("waits")
    ref = app.jobs.enqueue("test.wait.waiter", {"token": "race", "event": "approval:run-3"})
    awaiting(app, ref.id)
    apps = [App(settings) for _ in range(4)]
    try:
        barrier = threading.Barrier(len(apps))
        resumed: list[int] = []

        def send(other: App, n: int) -> None:
            barrier.wait()
            resumed.append(other.events.signal("approval:run-3", n))

        threads = [threading.Thread(target=send, args=(other, n)) for n, other in enumerate(apps)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        for other in apps:
            other.close()
    assert sorted(resumed) == [0, 0, 0, 1]
    completed(app, ref.id)
    time.sleep(1)
    rows = runs(database_url, "race")
    assert [p for _, p, _, _ in rows] == ["start", "start", "resumed"]


def test_a_waiting_job_holds_no_thread(app: App, workers, database_url):
    workers("waits")  # one thread
    ref = app.jobs.enqueue("test.wait.waiter", {"token": "thread", "event": "approval:run-4"})
    awaiting(app, ref.id)
    other = app.jobs.enqueue("test.wait.quick", {"token": "thread"})
    completed(app, other.id)
    assert app.jobs.get(ref.id).state == "awaiting"
    app.events.signal("approval:run-4", 4)
    completed(app, ref.id)
    assert phases(database_url, "thread") == ["start", "quick", "start", "resumed"]


def test_a_signal_sent_while_workers_are_stopped_resumes_the_job_once(app: App, workers, database_url):
    first = workers("waits")
    ref = app.jobs.enqueue("test.wait.waiter", {"token": "stopped", "event": "approval:run-5"})
    awaiting(app, ref.id)
    first.terminate()
    assert app.events.signal("approval:run-5", "late") == 1
    assert app.jobs.get(ref.id).state == "waiting"
    workers("waits")
    completed(app, ref.id)
    assert phases(database_url, "stopped") == ["start", "start", "resumed"]
    assert runs(database_url, "stopped")[-1][2] == "late"


def _survives_restart(app: App, database_url: str, restart) -> None:
    ref = app.jobs.enqueue("test.wait.waiter", {"token": "restart", "event": "approval:run-6"})
    later = app.jobs.enqueue("test.wait.waiter", {"token": "restart-later", "event": "approval:run-7"})
    awaiting(app, ref.id)
    awaiting(app, later.id)
    assert app.events.signal("approval:run-8", "before") == 0  # kept across the restart for a wait to come
    restart()
    assert wait_for(lambda: _signal(app, "approval:run-6", "after restart"), timeout=60) == 1
    completed(app, ref.id)
    assert runs(database_url, "restart")[-1][1:3] == ("resumed", "after restart")
    assert phases(database_url, "restart").count("resumed") == 1
    assert app.events.signal("approval:run-7", 7) == 1
    completed(app, later.id)
    kept = app.jobs.enqueue("test.wait.waiter", {"token": "restart-kept", "event": "approval:run-8"})
    completed(app, kept.id)
    assert [p for _, p, _, _ in runs(database_url, "restart-kept")] == ["start", "resumed"]
    assert runs(database_url, "restart-kept")[-1][2] == "before"


@pytest.fixture
def wait_table(clean_env, database_url) -> str:
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(wait_jobs.TABLE)
    return database_url


def test_a_wait_and_a_kept_signal_survive_a_restart_of_redis_with_aof(wait_table, tmp_path):
    with RedisServer(tempfile.mkdtemp(prefix="conveyor-redis-"), durable=True) as server:
        settings = make_settings("redis", server.url, wait_table, imports="tests.support.wait_jobs")
        app = App(settings)
        worker = WorkerProcess(settings, "waits", log=tmp_path / "worker.log")
        try:
            _survives_restart(app, wait_table, lambda: (server.stop(), server.start()))
        finally:
            worker.terminate()
            app.close()


def test_a_wait_and_a_kept_signal_survive_a_restart_of_postgres(wait_table, pg_server, tmp_path):
    settings = make_settings("postgres", None, wait_table, imports="tests.support.wait_jobs")
    app = App(settings)
    worker = WorkerProcess(settings, "waits", log=tmp_path / "worker.log")
    try:
        _survives_restart(app, wait_table, pg_server.restart)
    finally:
        worker.terminate()
        app.close()


def _signal(app: App, name: str, data: object) -> int | None:
    try:
        return app.events.signal(name, data)
    except Exception:  # the server is still coming back
        return None


def test_waits_work_in_memory_on_the_inline_broker(wait_table):
    app = App(make_settings("inline", None, wait_table, imports="tests.support.wait_jobs"))
    try:
        with running(app, "waits"):
            ref = app.jobs.enqueue("test.wait.waiter", {"token": "inline", "event": "approval:inline-1"})
            awaiting(app, ref.id)
            assert app.broker.get_job(ref.id).event == "approval:inline-1"
            other = app.jobs.enqueue("test.wait.quick", {"token": "inline"})  # its one thread is free
            completed(app, other.id)
            assert app.events.signal("approval:inline-1", [1, 2]) == 1
            assert app.events.signal("approval:inline-1", [3]) == 0
            completed(app, ref.id)
            assert app.events.signal("approval:inline-2", "early") == 0
            early = app.jobs.enqueue("test.wait.waiter", {"token": "inline-early", "event": "approval:inline-2"})
            late = app.jobs.enqueue("test.wait.waiter", {"token": "inline-late", "event": "never:3", "timeout": 0.5})
            completed(app, early.id)
            completed(app, late.id)
        assert phases(wait_table, "inline") == ["start", "quick", "start", "resumed"]
        assert runs(wait_table, "inline")[-1][2] == [1, 2]
        assert [p for _, p, _, _ in runs(wait_table, "inline-early")] == ["start", "resumed"]
        assert runs(wait_table, "inline-late")[-1][1:3] == ("resumed", None)
    finally:
        app.close()


def test_a_signal_racing_the_timeout_resumes_each_job_once(app: App, workers, database_url):
    workers("waits")
    timeout = 1.5
    refs = [
        app.jobs.enqueue("test.wait.waiter", {"token": "race-timeout", "event": f"race:{n}", "timeout": timeout})
        for n in range(6)
    ]
    for ref in refs:
        awaiting(app, ref.id)
    # Each signal lands somewhere around its job's deadline: before, at, or after it.
    deadline = max(app.jobs.get(ref.id).eta for ref in refs)
    time.sleep(max(0.0, deadline - time.time() - 0.3))
    for n, _ in enumerate(refs):
        app.events.signal(f"race:{n}", n)
        time.sleep(0.1)
    for ref in refs:
        completed(app, ref.id)
    time.sleep(1)
    rows = runs(database_url, "race-timeout")
    for n, ref in enumerate(refs):
        mine = [(phase, data) for job_id, phase, data, _ in rows if job_id == ref.id]
        assert [p for p, _ in mine] == ["start", "start", "resumed"], mine
        assert mine[-1][1] in (n, None), "the signal's data, or None when the timeout came first"


def test_a_parked_job_frees_its_groups_slot_and_resumes_in_its_group(app: App, workers, database_url):
    """Fair shares (issue 21.2): a wait ends the hold, so the group's next job runs meanwhile."""
    workers("waits", CONVEYOR_QUEUES__WAITS__GROUP_CONCURRENCY="1")
    ref = app.jobs.enqueue("test.wait.waiter", {"token": "grp-wait", "event": "approval:grp"}, group="t1")
    awaiting(app, ref.id)
    quick = app.jobs.enqueue("test.wait.quick", {"token": "grp-quick"}, group="t1")
    completed(app, quick.id)  # t1's one slot was free while its first job awaited
    assert app.events.signal("approval:grp", "go") == 1
    completed(app, ref.id)
    assert phases(database_url, "grp-wait") == ["start", "start", "resumed"]
