"""The Postgres broker's fences under real faults: a crashed server, texts Postgres cannot store,
refused writes, outages longer than the lease, superseded deliveries, outcomes in flight.

Each test here failed before the fix it names (issue 10). Supersession is
real: a worker stops heartbeating, a recovery pass takes its job back and
another consumer claims it again.
"""

from __future__ import annotations

import contextlib
import os
import signal
import tempfile
import threading
import time

import psycopg
import pytest

from conveyor.app import App
from conveyor.brokers.postgres.deliveries import Retry
from conveyor.errors import InvalidPayload
from tests.support.harness import make_settings, running
from tests.support.servers import PostgresServer
from tests.support.waiting import wait_for


def sql(database_url: str, query: str, params=None) -> list[tuple]:
    with psycopg.connect(database_url, autocommit=True) as conn:
        cur = conn.execute(query, params)
        return cur.fetchall() if cur.description else []


def finished(app, job_id):
    record = app.broker.get_job(job_id)
    return record if record and record.state in ("completed", "failed") else None


class Apps:
    """``make_app(url=..., **settings) -> App``; ``close()`` closes every App made so far (again: nothing)."""

    def __init__(self, database_url: str) -> None:
        self.database_url = database_url
        self.apps: list[App] = []

    def __call__(self, url: str | None = None, **overrides) -> App:
        app = App(make_settings("postgres", None, url or self.database_url, **overrides))
        self.apps.append(app)
        return app

    def close(self) -> None:
        apps, self.apps = self.apps, []
        for app in apps:
            app.close()


@pytest.fixture
def make_app(clean_env, database_url):
    apps = Apps(database_url)
    yield apps
    apps.close()


# -- jobs whose errors Postgres cannot store as they are (test.pg.bad: tests/support/jobs.py) --


def test_nul_and_lone_surrogates_in_an_error_keep_the_retry_and_the_final_failure(make_app, database_url):
    app = make_app()
    with running(app, "critical"):
        retried = app.jobs.enqueue("test.pg.bad", {"token": "retried", "fail_times": 1})
        failed = app.jobs.enqueue("test.pg.bad", {"token": "failed", "permanent": True})
        first = wait_for(lambda: finished(app, retried.id), timeout=30, message="the retried job")
        last = wait_for(lambda: finished(app, failed.id), timeout=30, message="the failed job")
        # The consumer is alive and its outbox not poisoned: later jobs still complete.
        after = app.jobs.enqueue("test.probe.critical", {"token": "after-bad-text"})
        wait_for(lambda: finished(app, after.id), timeout=30, message="a job after the bad texts")
    assert (first.state, first.attempts) == ("completed", 2), "the retry was written, not lost"
    assert last.state == "failed" and "\\x00" in last.error and "\\ud800" in last.error
    dead = sql(database_url, "SELECT job_id, error FROM probe_dead")
    assert [d[0] for d in dead] == [failed.id], "the final-failure hook ran once"
    assert app.broker.get_job(after.id).state == "completed"


def test_an_outcome_postgres_refuses_neither_blocks_the_others_nor_is_lost(make_app, database_url):
    # A real refusal, not a mock: the table refuses this one error text.
    sql(
        database_url,
        "ALTER TABLE conveyor_jobs ADD CONSTRAINT test_no_poison CHECK (error IS NULL OR error NOT LIKE '%%poison%%')",
    )
    app = make_app()
    with running(app, "critical"):
        poisoned = app.jobs.enqueue("test.pg.bad", {"token": "poisoned", "permanent": True, "error": "poison"})
        others = [app.jobs.enqueue("test.probe.critical", {"token": f"next-{i}"}) for i in range(5)]
        for ref in others:
            wait_for(lambda: finished(app, ref.id), timeout=30, message="the jobs next to the refused outcome")
        record = wait_for(lambda: finished(app, poisoned.id), timeout=30, message="the refused outcome")
    assert record.state == "failed" and "could not be stored" in record.error


def test_a_payload_postgres_cannot_store_is_refused_naming_the_field(make_app):
    app = make_app()
    with pytest.raises(InvalidPayload, match="token") as caught:
        app.jobs.enqueue("test.probe.critical", {"token": "a\x00b"})
    assert "a\x00b" not in str(caught.value), "the value is not echoed"
    assert app.broker.queue_counts("critical").waiting == 0


# -- a crashed server (item 5) ------------------------------------------------------------


@pytest.fixture(scope="module")
def durable_pg():
    """A private server that keeps what it acknowledged: fsync and synchronous commit on."""
    settings = {"fsync": "on", "synchronous_commit": "on", "full_page_writes": "on"}
    with PostgresServer(tempfile.mkdtemp(prefix="conveyor-pg-durable-"), settings=settings) as server:
        yield server


@pytest.fixture
def durable_url(durable_pg, make_app):
    from conveyor.platform.blueprint import jobs as platform
    from conveyor.schema.migrate import migrate

    name = f"crash_{int(time.time() * 1000)}"
    durable_pg.create_database(name)
    url = durable_pg.url(name)
    migrate(url, [platform])
    yield url
    # The Apps on this database close first: an App's close writes its chart counts (opening its
    # pool if need be), and a pool on a dropped database waits its whole open timeout (30 s).
    make_app.close()
    if not durable_pg.is_running:
        durable_pg.start()
    durable_pg.drop_database(name)


def _write_outcomes(app) -> None:
    def written():
        try:
            app.broker.deliveries.write()
        except Exception:
            return False
        return not app.broker.deliveries

    wait_for(written, timeout=30, message="the outbox to be written after the restart")


def _crash_before_the_wal_writer_flushes(server: PostgresServer, url: str) -> int:
    """Freeze the WAL writer, so that asynchronous commits from now on stay unflushed (on a busy
    server that window is up to ``wal_writer_delay``), and the caller's next steps run in it."""
    writer = sql(url, "SELECT pid FROM pg_stat_activity WHERE backend_type = 'walwriter'")[0][0]
    os.kill(writer, signal.SIGSTOP)
    return writer


def test_a_postgres_crash_never_hands_the_same_delivery_out_twice(make_app, durable_pg, durable_url):
    a, b = make_app(durable_url, pg_lease_seconds=60), make_app(durable_url, pg_lease_seconds=60)
    ref = a.jobs.enqueue("test.probe.critical", {"token": "crash"})
    consumer_a = a.broker.consume("critical", prefetch=1, timeout=1000)  # its heartbeat is written now
    wait_for(lambda: a.broker.proofs.epoch, timeout=10, message="the claim prover to connect")
    writer = _crash_before_the_wal_writer_flushes(durable_pg, durable_url)
    run_a = next(consumer_a)
    assert a.broker.start_job(run_a) == 1, "worker A runs the job"

    os.kill(writer, signal.SIGKILL)
    durable_pg.kill()  # SIGKILL of the postmaster: whatever was not flushed is gone
    durable_pg.start()

    consumer_b = wait_for(lambda: _consume(b), timeout=30, message="worker B to connect")
    try:
        got = next(consumer_b)
        assert got is None or got.options["pg_delivery"] > run_a.options["pg_delivery"], (
            "a delivery number handed out before the crash was handed out again"
        )
        delivery, worker = sql(durable_url, "SELECT delivery, worker_id FROM conveyor_jobs WHERE id = %s", (ref.id,))[0]
        assert (delivery, worker) == (run_a.options["pg_delivery"], a.broker.worker_id), "A's claim survived the crash"
        consumer_a.ack(run_a)
        _write_outcomes(a)
        assert a.broker.get_job(ref.id).state == "completed"
    finally:
        consumer_b.close()
        with contextlib.suppress(Exception):
            consumer_a.close()


def test_a_retry_lost_in_a_crash_is_not_turned_into_done_by_the_ack_after_it(make_app, durable_pg, durable_url):
    app = make_app(durable_url, pg_lease_seconds=1.5)
    ref = app.jobs.enqueue("test.probe.critical", {"token": "lost-retry"})
    consumer = app.broker.consume("critical", prefetch=1, timeout=1000)
    wait_for(lambda: app.broker.proofs.epoch, timeout=10, message="the claim prover to connect")
    try:
        writer = _crash_before_the_wal_writer_flushes(durable_pg, durable_url)
        message = next(consumer)
        assert app.broker.start_job(message) == 1
        # The run failed: the retries middleware writes its retry, then Dramatiq acks the delivery.
        app.broker.enqueue(message.copy(options={"last_error": "RuntimeError: once"}), delay=0)
        consumer.ack(message)
        os.kill(writer, signal.SIGKILL)
        durable_pg.kill()  # the retry, committed asynchronously, is lost
        durable_pg.start()
        _write_outcomes(app)
        assert app.broker.get_job(ref.id).state != "completed", "the ack ended a job whose retry was lost"
        # Still held by its (durable) claim: the orphan pass hands it out again.
        wait_for(
            lambda: ref.id in app.broker.recover().get("critical", []),
            timeout=30,
            message="the orphan pass to hand the job back",
        )
        assert app.broker.get_job(ref.id).state == "waiting"
    finally:
        consumer.close()


def test_a_deferred_retry_lost_in_a_crash_is_not_turned_into_done_either(make_app, durable_pg, durable_url):
    app = make_app(durable_url, pg_lease_seconds=1.5)
    ref = app.jobs.enqueue("test.probe.critical", {"token": "lost-deferred-retry"})
    consumer = app.broker.consume("critical", prefetch=1, timeout=1000)
    try:
        message = next(consumer)
        assert app.broker.start_job(message) == 1
        # The retry found Postgres away and waits in the outbox (what PostgresBroker._retry does then) ...
        stored = message.copy(options={"last_error": "RuntimeError: once"}).encode().decode()
        app.broker.deliveries.put_retry(
            ref.id, message.options["pg_delivery"], Retry(stored, time.monotonic(), "RuntimeError: once")
        )
        writer = _crash_before_the_wal_writer_flushes(durable_pg, durable_url)
        app.broker.deliveries.write()  # ... is written once it is back (asynchronously) ...
        consumer.ack(message)  # ... and Dramatiq's ack comes after it
        os.kill(writer, signal.SIGKILL)
        durable_pg.kill()
        durable_pg.start()
        _write_outcomes(app)
        assert app.broker.get_job(ref.id).state != "completed", "the ack ended a job whose retry was lost"
    finally:
        consumer.close()


def _consume(app):
    try:
        return app.broker.consume("critical", prefetch=1, timeout=500)
    except Exception:
        return None


# -- recovery after an outage (item 8) ------------------------------------------------------


def test_a_process_started_right_after_an_outage_leaves_live_workers_jobs_alone(make_app, pg_server):
    lease = 1.5
    live = make_app(pg_lease_seconds=lease)
    ref = live.jobs.enqueue("test.probe.critical", {"token": "outage"})
    consumer = live.broker.consume("critical", prefetch=1, timeout=1000)
    try:
        held = next(consumer)
        assert held.message_id == ref.id
        pg_server.stop()
        time.sleep(lease * 2)  # the outage outlasts the lease: every heartbeat is old now
        pg_server.start()
        fresh = make_app(pg_lease_seconds=lease)
        assert fresh.broker.maintain() == {}, "a fresh process took a live worker's job at once"
        assert live.broker.get_job(ref.id).state == "active"
        # The live worker re-heartbeats within the lease and keeps its job.
        wait_for(
            lambda: live.broker.listener.beating(within=lease / 3),
            timeout=20,
            message="the live worker to heartbeat again",
        )
        time.sleep(lease)
        assert fresh.broker.recover() == {}
        assert live.broker.get_job(ref.id).state == "active"
    finally:
        consumer.close()


# -- superseded deliveries (items 8 and 9) ---------------------------------------------------


def _supersede(make_app, lease: float = 1.0):
    """Worker A holds delivery 1 of a job and stops heartbeating; recovery takes it back and B claims it."""
    a, b = make_app(pg_lease_seconds=lease), make_app(pg_lease_seconds=lease)
    ref = a.jobs.enqueue("test.probe.indexing", {"token": "twice"})
    consumer_a = a.broker.consume("indexing", prefetch=1, timeout=1000)
    old = next(consumer_a)
    assert a.broker.start_job(old) == 1
    a.broker.listener.stop()  # A's heartbeat stops (its host froze, say)
    wait_for(lambda: b.broker.recover().get("indexing"), timeout=20, message="recovery to take A's job back")
    consumer_b = b.broker.consume("indexing", prefetch=1, timeout=1000)
    new = wait_for(lambda: next(consumer_b), timeout=10, message="B to claim the job")
    assert new.message_id == ref.id
    assert new.options["pg_delivery"] > old.options["pg_delivery"]
    return ref, a, consumer_a, old, b, consumer_b, new


def test_outcome_of_a_superseded_delivery_changes_nothing(make_app):
    ref, a, consumer_a, old, b, consumer_b, new = _supersede(make_app)
    try:
        assert a.broker.start_job(old) == 0, "a superseded delivery does not start"
        assert b.broker.start_job(new) == 2
        consumer_a.ack(old)
        a.broker.deliveries.write()
        assert b.broker.get_job(ref.id).state == "active", "A's late ack did not end B's run"
        consumer_b.ack(new)
        b.broker.deliveries.write()
        assert b.broker.get_job(ref.id).state == "completed"
    finally:
        consumer_a.close()
        consumer_b.close()


def test_a_superseded_delivery_cannot_claim_the_final_failure(make_app):
    ref, a, consumer_a, old, b, consumer_b, new = _supersede(make_app)
    try:
        assert not a.broker.claim_final_failure(old), "the job is not over: B runs it"
        assert b.broker.claim_final_failure(new), "the current delivery's final failure runs the hooks"
        assert b.broker.get_job(ref.id).state == "active", "held until its hooks are done (the nack)"
        # Asked again by the same delivery (its first reply was lost): still its claim; never the old one's.
        assert b.broker.claim_final_failure(new)
        assert not a.broker.claim_final_failure(old)
        new.fail()
        consumer_b.nack(new)
        b.broker.deliveries.write()
        assert b.broker.get_job(ref.id).state == "failed", "the nack after the hooks fails it"
        old.fail()
        consumer_a.nack(old)
        a.broker.deliveries.write()
        assert b.broker.queue_counts("indexing").failed_total == 1, "counted once"
    finally:
        consumer_a.close()
        consumer_b.close()


def test_a_start_repeated_after_a_lost_reply_counts_the_attempt_once(make_app):
    app = make_app()
    app.jobs.enqueue("test.probe.indexing", {"token": "start-twice"})
    consumer = app.broker.consume("indexing", prefetch=1, timeout=1000)
    try:
        message = next(consumer)
        assert app.broker.start_job(message) == 1
        assert app.broker.start_job(message) == 1, "the same delivery's start, repeated, is one attempt"
    finally:
        consumer.close()


def test_an_old_deliverys_ack_does_not_free_the_room_of_the_new_one(make_app, database_url):
    lease = 1.0
    a, b = make_app(pg_lease_seconds=lease), make_app(pg_lease_seconds=lease)
    ref = a.jobs.enqueue("test.probe.indexing", {"token": "again"})
    consumer = a.broker.consume("indexing", prefetch=2, timeout=300)
    try:
        old = next(consumer)
        # B has watched the server's clock for a lease (a fresh process declares nobody dead before).
        b.broker.recover()
        time.sleep(lease * 1.2)
        # A's heartbeat looked dead for a moment (a long GC pause, say): recovery takes the job back.
        sql(
            database_url,
            "UPDATE conveyor_workers SET heartbeat_at = now() - interval '1 hour' WHERE id = %s",
            (a.broker.worker_id,),
        )
        wait_for(lambda: b.broker.recover().get("indexing"), timeout=20, message="recovery to take the job back")
        new = wait_for(lambda: next(consumer), timeout=10, message="A to claim the job again")
        assert (new.message_id, new.options["pg_delivery"]) == (ref.id, old.options["pg_delivery"] + 1)
        consumer.ack(old)  # the old run ends; the new one still runs
        for i in range(3):
            a.jobs.enqueue("test.probe.indexing", {"token": f"more-{i}"})
        for _ in range(4):
            next(consumer)
        held = sql(database_url, "SELECT count(*) FROM conveyor_jobs WHERE worker_id = %s", (a.broker.worker_id,))[0][0]
        assert held == 2, f"prefetch 2, but {held} jobs are claimed"
    finally:
        consumer.close()


def test_a_job_that_ran_past_the_lease_is_not_handed_back_while_its_done_is_written(make_app):
    lease = 1.0
    app = make_app(pg_lease_seconds=lease)
    ref = app.jobs.enqueue("test.probe.indexing", {"token": "long"})
    consumer = app.broker.consume("indexing", prefetch=1, timeout=1000)
    try:
        message = next(consumer)
        assert app.broker.start_job(message) == 1
        time.sleep(lease * 1.5)  # it runs past the lease
        consumer.ack(message)
        # Hold the worker pool's connections, so that the outbox write is in flight and waits.
        jobs = app.broker.jobs
        with contextlib.ExitStack() as stack:
            for _ in range(16):
                stack.enter_context(jobs._conn(fast=True))
            writer = threading.Thread(target=app.broker.deliveries.write)
            writer.start()
            wait_for(lambda: not app.broker.deliveries, timeout=5, message="the write to take the outcome")
            app.broker.recover()  # the orphan pass runs meanwhile
        writer.join(10)
        assert app.broker.get_job(ref.id).state == "completed", "the done was written, the job not handed back"
    finally:
        consumer.close()


def test_the_brokers_durable_writes_commit_synchronously_whatever_the_servers_default(make_app, database_url):
    # The session's test server runs with synchronous_commit off (tests/support/servers.py), as an operator might.
    assert sql(database_url, "SHOW synchronous_commit") == [("off",)]
    app = make_app()
    with app.broker.jobs._conn() as conn:  # enqueues, synchronous claims, final failures, recovery
        assert conn.execute("SHOW synchronous_commit").fetchone() == ("on",)
    with app.broker.jobs._conn(fast=True) as conn:  # starts, outcomes, retries
        assert conn.execute("SHOW synchronous_commit").fetchone() == ("off",)


def test_a_run_that_raised_is_never_acked_done_without_its_retry(make_app):
    app = make_app()
    ref = app.jobs.enqueue("test.probe.indexing", {"token": "raised"})
    consumer = app.broker.consume("indexing", prefetch=1, timeout=1000)
    try:
        message = next(consumer)
        assert app.broker.start_job(message) == 1
        # The run raised and the retries middleware broke before writing the retry (Dramatiq only logs
        # that): the ack that follows must not end the job.
        message.stuff_exception(RuntimeError("the run failed"))
        consumer.ack(message)
        app.broker.deliveries.write()
        assert app.broker.get_job(ref.id).state == "waiting"
    finally:
        consumer.close()


def test_skipped_outcomes_leave_no_mark_that_could_swallow_a_later_one(make_app):
    app = make_app()
    first = app.jobs.enqueue("test.probe.indexing", {"token": "retried-now"})
    second = app.jobs.enqueue("test.probe.indexing", {"token": "retried-later"})
    consumer = app.broker.consume("indexing", prefetch=2, timeout=1000)
    try:
        a, b = next(consumer), next(consumer)
        for message in (a, b):
            assert app.broker.start_job(message) == 1
        app.broker.enqueue(a.copy(options={"last_error": "RuntimeError: once"}), delay=0)  # written at once
        consumer.ack(a)
        stored = b.copy(options={"last_error": "RuntimeError: once"}).encode().decode()
        app.broker.deliveries.put_retry(
            b.message_id, b.options["pg_delivery"], Retry(stored, time.monotonic(), "RuntimeError: once")
        )
        consumer.ack(b)  # the ack comes before the deferred retry is written
        app.broker.deliveries.write()
        assert {app.broker.get_job(r.id).state for r in (first, second)} == {"waiting"}
        assert not app.broker.deliveries._abandoned, "a stale mark would drop a re-issued delivery's outcome"
    finally:
        consumer.close()


# -- an enqueue whose reply is lost ----------------------------------------------------


@pytest.fixture
def pg_proxy(database_url):
    """A TCP proxy in front of the test's Postgres that can drop its replies (the requests still arrive)."""
    from tests.support.proxy import ReplyDroppingProxy

    port = int(psycopg.conninfo.conninfo_to_dict(database_url)["port"])
    with ReplyDroppingProxy(port) as proxy:
        yield proxy, database_url.replace(f":{port}/", f":{proxy.port}/")


def _jobs_keyed(database_url: str, key: str) -> int:
    return sql(database_url, "SELECT count(*) FROM conveyor_jobs WHERE job_key = %s", (key,))[0][0]


@pytest.mark.timeout(60)
def test_an_enqueue_whose_commit_reply_is_lost_fails_in_time_as_unknown_and_its_keyed_resend_gets_the_job(
    pg_proxy, make_app, database_url
):
    """The proxy lets the COMMIT through (Postgres commits) and loses its answer, the connection staying up:
    no TCP timeout or keepalive notices. The enqueue must not wait for ever: after pg_enqueue_timeout it says
    the job may exist, and enqueued again with its key it returns that one job."""
    from conveyor.errors import EnqueueOutcomeUnknown

    proxy, url = pg_proxy
    app = make_app(url, pg_enqueue_timeout=1.0)
    app.jobs.enqueue("test.probe.critical", {"token": "warm-up"})  # a pooled connection is open
    proxy.drop_next(1, containing=b"COMMIT")
    began = time.monotonic()
    with pytest.raises(EnqueueOutcomeUnknown, match="may have been enqueued"):
        app.jobs.enqueue("test.probe.critical", {"token": "commit-lost"}, key="pg-lost-commit")
    waited = time.monotonic() - began
    assert proxy.dropped == 1, "no reply was lost: the test proved nothing"
    assert waited < 10, f"the enqueue waited {waited:.1f} s for a reply that never came"
    assert _jobs_keyed(database_url, "pg-lost-commit") == 1, "Postgres committed the enqueue whose reply was lost"
    again = app.jobs.enqueue("test.probe.critical", {"token": "commit-lost"}, key="pg-lost-commit")
    assert again.deduplicated and _jobs_keyed(database_url, "pg-lost-commit") == 1
    assert sql(database_url, "SELECT id FROM conveyor_jobs WHERE job_key = 'pg-lost-commit'")[0][0] == again.id


@pytest.mark.timeout(60)
def test_an_enqueue_whose_statement_reply_is_lost_fails_in_time_and_nothing_was_enqueued(
    pg_proxy, make_app, database_url
):
    """Lost before the COMMIT was sent, the transaction never commits: a definite "nothing was enqueued"."""
    from conveyor.errors import BrokerUnavailable

    proxy, url = pg_proxy
    app = make_app(url, pg_enqueue_timeout=1.0)
    app.jobs.enqueue("test.probe.critical", {"token": "warm-up"})
    proxy.drop_next(1, containing=b"SELECT 1\x00")  # the enqueue statement's completion
    with pytest.raises(BrokerUnavailable, match="nothing was enqueued"):
        app.jobs.enqueue("test.probe.critical", {"token": "insert-lost"}, key="pg-lost-insert")
    assert proxy.dropped == 1
    wait_for(lambda: _jobs_keyed(database_url, "pg-lost-insert") == 0, timeout=10, message="no job")
    again = app.jobs.enqueue("test.probe.critical", {"token": "insert-lost"}, key="pg-lost-insert")
    assert not again.deduplicated and _jobs_keyed(database_url, "pg-lost-insert") == 1


@pytest.mark.timeout(60)
def test_an_enqueue_with_a_warm_pool_on_a_stopped_postgres_says_nothing_was_enqueued(make_app, pg_server):
    """A pooled connection a stopped Postgres broke fails before the COMMIT could be sent: a definite
    "nothing was enqueued", which a keyless caller may resend (an autocommit enqueue could not say so)."""
    from conveyor.errors import BrokerUnavailable

    app = make_app()
    app.jobs.enqueue("test.probe.critical", {"token": "warm-up"})  # the pool holds a live connection
    pg_server.stop()
    try:
        with pytest.raises(BrokerUnavailable, match="nothing was enqueued"):
            app.jobs.enqueue("test.probe.critical", {"token": "down"}, key="warm-down:1")
    finally:
        pg_server.start()
    assert _jobs_keyed(app.settings.database_url, "warm-down:1") == 0
