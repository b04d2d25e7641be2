"""Exactly-once effects for a job's own code (issue 18): ctx.delivery, ctx.once, ctx.transaction, ctx.check_fence.

The central test is finding 6 of the issue, on every broker with worker
processes: worker A is stopped (SIGSTOP) in the middle of a job, longer
than its lease; worker B recovers the job and runs it to its end; A
resumes and carries on. A's unguarded effect lands a second time (that is
the finding, and the proof that A really ran after B), while its
once-guarded step is skipped, its transactional effect rolls back with the
job's completion refused (postgres), and ``ctx.check_fence`` raises in it.

``test.effect`` (tests/support/jobs.py) writes every step it takes to
``effect_log``: the tests read what each delivery did from there.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time

import psycopg
import pytest
from dramatiq import Message

from conveyor.app import App
from conveyor.errors import NoDelivery, NotInTransaction, TransactionalCompletionUnsupported
from conveyor.tasks.context import JobContext
from tests.support.brokers import ALL_BROKERS, SERVER_BROKERS
from tests.support.harness import ROOT, WorkerProcess, env_for, make_settings, running
from tests.support.waiting import wait_for

QUEUE = "nudge"


def effects(database_url: str, token: str) -> list[dict]:
    with psycopg.connect(database_url) as conn:
        cur = conn.execute(
            "SELECT job_id, delivery, attempt, pid, kind FROM effect_log WHERE token = %s ORDER BY id", (token,)
        )
        return [dict(zip(("job_id", "delivery", "attempt", "pid", "kind"), row)) for row in cur.fetchall()]


def kinds(rows: list[dict], **where) -> list[str]:
    return [r["kind"] for r in rows if all(r[k] == v for k, v in where.items())]


def steps(database_url: str, job_id: str) -> list[tuple]:
    with psycopg.connect(database_url) as conn:
        return conn.execute("SELECT step, delivery FROM conveyor_job_steps WHERE job_id = %s", (job_id,)).fetchall()


@pytest.fixture
def make_app(clean_env, database_url, request):
    apps = []

    def make(broker: str, **overrides) -> App:
        redis_url = request.getfixturevalue("redis_url") if broker == "redis" else None
        app = App(make_settings(broker, redis_url, database_url, **overrides))
        apps.append(app)
        return app

    yield make
    for app in apps:
        app.close()


# -- a paused worker resumes after its lease (finding 6) ------------------------------------------


class UnfencedWorker:
    """One worker process with no self-fence watchdog (tests/support/unfenced_worker.py), logging to ``log``."""

    def __init__(self, settings, log) -> None:
        self._log = open(log, "wb")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tests.support.unfenced_worker", QUEUE, "1"],
            env=env_for(settings),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=self._log,
            cwd=ROOT,
            start_new_session=True,
        )

    def stop(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.proc.pid, signal.SIGCONT)
            self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(60)
        finally:
            if self.proc.poll() is None:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
            self._log.close()


@pytest.mark.parametrize("broker", SERVER_BROKERS)
def test_a_paused_worker_resuming_after_its_lease_applies_no_fenced_effect_twice(
    broker, make_app, database_url, tmp_path
):
    app = make_app(broker)
    token = f"pause-{broker}"
    stale = UnfencedWorker(app.settings, tmp_path / "stale.log")
    rescuer = None
    try:
        # A long hold on the first attempt: the test stops the worker in it (the hold's remainder is gone on resume).
        ref = app.jobs.enqueue("test.effect", {"token": token, "hold": 15})
        started = wait_for(
            lambda: kinds(effects(database_url, token), kind="started") and effects(database_url, token)[0],
            timeout=60,
            message="the first delivery to start",
        )
        assert started["pid"] == stale.proc.pid
        os.kill(stale.proc.pid, signal.SIGSTOP)
        stopped_at = time.monotonic()

        rescuer = WorkerProcess(app.settings, QUEUE, log=tmp_path / "rescuer.log")
        wait_for(
            lambda: (r := app.broker.get_job(ref.id)) is not None and r.state == "completed",
            timeout=60,
            message="the job recovered and completed by the other worker",
        )
        rows = effects(database_url, token)
        second = [r for r in rows if r["pid"] != stale.proc.pid]
        assert second and second[0]["delivery"] > started["delivery"], rows
        assert time.monotonic() - stopped_at > app.settings.worker_lease, "recovered only after the lease"

        os.kill(stale.proc.pid, signal.SIGCONT)
        wait_for(
            lambda: "ended" in kinds(effects(database_url, token), pid=stale.proc.pid),
            timeout=60,
            message="the resumed worker to finish its stale run",
        )
    finally:
        stale.stop()
        if rescuer is not None:
            rescuer.terminate()

    rows = effects(database_url, token)
    first, current = started["delivery"], second[0]["delivery"]
    stale_kinds = kinds(rows, delivery=first)
    current_kinds = kinds(rows, delivery=current)
    assert kinds(rows, kind="naive") == ["naive", "naive"], "the unguarded effect doubled: the stale run went on"
    assert [r["delivery"] for r in rows if r["kind"] == "once"] == [current], "the once-guarded step applied once"
    assert steps(database_url, ref.id) == [("effect", current)]
    assert "fence_raised" in stale_kinds and "fence_raised" not in current_kinds, rows
    if app.capabilities.transactional_completion:
        assert [r["delivery"] for r in rows if r["kind"] == "transactional"] == [current], rows
        assert "rolled_back" in stale_kinds, "the stale delivery's completion was refused and its effect rolled back"
    record = app.broker.get_job(ref.id)
    assert (record.state, record.attempts) == ("completed", 2)
    assert app.broker.queue_counts(QUEUE).completed_total == 1
    assert not kinds(rows, attempt=3), "the stale delivery's outcome started nothing new"
    refused = [e for e in rescuer.events() if e.get("job_id") == ref.id and e["event"] in ("refused", "error")]
    assert refused == [], "the current delivery's ack after its completion raised no alarm"


# -- the API on every broker, in one process ------------------------------------------------------


@pytest.mark.parametrize("broker", ALL_BROKERS)
def test_a_once_guarded_step_applies_once_across_a_retry_and_each_delivery_has_its_own_number(
    broker, make_app, database_url
):
    app = make_app(broker)
    token = f"retry-{broker}"
    with running(app, QUEUE):
        ref = app.jobs.enqueue("test.effect", {"token": token, "fail_times": 1})
        wait_for(
            lambda: (r := app.broker.get_job(ref.id)) is not None and r.state == "completed",
            timeout=30,
            message="the job to complete on its second attempt",
        )
    rows = effects(database_url, token)
    deliveries = sorted({r["delivery"] for r in rows})
    assert len(deliveries) == 2 and deliveries[0] < deliveries[1], rows
    assert [r["delivery"] for r in rows if r["kind"] == "once"] == [deliveries[0]], "the first delivery's step holds"
    assert kinds(rows, kind="naive") == ["naive", "naive"]
    assert not kinds(rows, kind="fence_raised"), "a current delivery passes its fence check"
    if app.capabilities.transactional_completion:
        assert [r["delivery"] for r in rows if r["kind"] == "transactional"] == [deliveries[1]]
    assert app.broker.queue_counts(QUEUE).completed_total == 1


def _context(app: App, message: Message | None = None) -> JobContext:
    return JobContext("test.effect", QUEUE, "job-1", 1, 3, app, delivery=1 if message else None, message=message)


@pytest.mark.parametrize("broker", ALL_BROKERS)
def test_once_refuses_a_connection_without_a_transaction(broker, make_app):
    app = make_app(broker)
    with app.pool.connection() as conn:
        with pytest.raises(NotInTransaction):
            _context(app).once(conn, "step")
        with conn.transaction():
            assert _context(app).once(conn, "step") is True
        with conn.transaction():
            assert _context(app).once(conn, "step") is False, "the second call finds the first one's record"
            assert _context(app).once(conn, "other") is True


def test_a_hook_has_no_delivery_to_fence_or_complete(make_app):
    app = make_app("postgres")
    ctx = _context(app)
    with pytest.raises(NoDelivery):
        ctx.check_fence()
    with pytest.raises(NoDelivery), ctx.transaction():
        pass


@pytest.mark.parametrize("broker", ["redis", "inline"])
def test_completion_in_a_transaction_is_refused_where_jobs_are_not_postgres_rows(broker, make_app):
    app = make_app(broker)
    message = Message(queue_name=QUEUE, actor_name="test.effect", args=({},), kwargs={}, options={})
    ctx = _context(app, message)
    assert not ctx.can_complete_in_transaction
    with pytest.raises(TransactionalCompletionUnsupported), ctx.transaction():
        pass


def test_steps_are_pruned_with_their_job_and_orphans_after_the_retention(make_app, database_url):
    app = make_app("postgres", retention=60)
    kept = app.jobs.enqueue("test.effect", {"token": "kept"})
    pruned = app.jobs.enqueue("test.effect", {"token": "pruned"})
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(
            "UPDATE conveyor_jobs SET status = 'done', completed_at = now() - interval '2 minutes' WHERE id = %s",
            (pruned.id,),
        )
        conn.execute(
            "INSERT INTO conveyor_job_steps (job_id, step, done_at) VALUES (%s, 'a', now() - interval '1 hour'), "
            "(%s, 'a', now() - interval '1 hour'), ('deleted-job', 'a', now() - interval '1 hour'), "
            "('deleted-recently', 'a', now())",
            (kept.id, pruned.id),
        )
    assert app.broker.prune() == 1
    with psycopg.connect(database_url) as conn:
        left = {row[0] for row in conn.execute("SELECT job_id FROM conveyor_job_steps")}
    assert left == {kept.id, "deleted-recently"}, "a live job keeps its steps however old; a gone job's go"
