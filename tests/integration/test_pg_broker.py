"""The Postgres broker inside one process: claims, the poll, transactions, recovery by two replicas.

Queue behaviour shared with the other brokers (ack, retry, delay, dedup,
concurrency, pause) is in test_core_behaviour.py, and what every broker
promises at its interface is in tests/contract (a row whose message cannot be
decoded: test_malformed.py; wake-ups, keys and recovery: test_wakeup.py,
test_keys.py, test_recovery.py); this file covers what is particular to one table
being the queue. Crashes are simulated in the data
(an aged heartbeat, a row moved by hand), never slept on.
"""

from __future__ import annotations

import threading
import time
import uuid

import psycopg
import pytest
from dramatiq import Message

from conveyor.app import App
from conveyor.errors import TransactionalEnqueueUnsupported
from tests.support.harness import make_settings, probe_dead, probe_runs, running
from tests.support.waiting import wait_for


@pytest.fixture
def make_app(clean_env, database_url):
    apps = []

    def make(**overrides) -> App:
        app = App(make_settings("postgres", None, database_url, **overrides))
        apps.append(app)
        return app

    yield make
    for app in apps:
        app.close()


@pytest.fixture
def app(make_app):
    return make_app()


def sql(database_url: str, query: str, params=None) -> list[tuple]:
    with psycopg.connect(database_url, autocommit=True) as conn:
        cur = conn.execute(query, params)
        return cur.fetchall() if cur.description else []


def finished(app, job_id):
    record = app.broker.get_job(job_id)
    return record if record and record.state in ("completed", "failed") else None


def probe_message(job_id: str, queue: str, token: str) -> str:
    message = Message(
        queue_name=queue,
        actor_name=f"test.probe.{queue}",
        args=({"token": token},),
        kwargs={},
        options={},
        message_id=job_id,
    )
    return message.encode().decode()


# -- claim ----------------------------------------------------------------------


def test_claim_takes_a_fifo_batch_up_to_the_prefetch_and_marks_it_in_progress(app, database_url):
    refs = [app.jobs.enqueue("test.probe.indexing", {"token": f"fifo-{i}"}) for i in range(6)]
    consumer = app.broker.consume("indexing", prefetch=4, timeout=1000)
    try:
        first = next(consumer)
        rows = sql(
            database_url,
            "SELECT id, worker_id, delivery, picked_at IS NOT NULL FROM conveyor_jobs "
            "WHERE status = 'in_progress' ORDER BY picked_at",
        )
        assert len(rows) == 4, "one claim takes the whole room of the prefetch"
        assert {r[1] for r in rows} == {app.broker.worker_id}
        assert all(r[2] == 1 and r[3] for r in rows)
        got = [first] + [next(consumer) for _ in range(3)]
        assert [m.message_id for m in got] == [r.id for r in refs[:4]], "first enqueued, first claimed"
        assert app.broker.get_job(refs[4].id).state == "waiting"
        consumer.requeue(got)  # what a stopping worker does with messages it never started
    finally:
        consumer.close()
    assert app.broker.queue_counts("indexing").waiting == 6


#: The partial index of waiting rows in claim order within a group (0075; 0076 dropped 0074's
#: conveyor_jobs_ready, which it covers): the plain claim reads the default group (job_group = '') by it.
READY_INDEXES = ("conveyor_jobs_group_pending",)


def test_a_long_history_stays_out_of_the_claim_path(app, database_url):
    sql(
        database_url,
        "INSERT INTO conveyor_jobs (id, queue, job, status, message, completed_at) "
        "SELECT 'old-' || i, 'indexing', 'test.probe.indexing', 'done', '{}', now() "
        "FROM generate_series(1, 20000) i",
    )
    app.jobs.enqueue("test.probe.indexing", {"token": "fresh"})
    sql(database_url, "ANALYZE conveyor_jobs")
    from conveyor.brokers.postgres import QUERIES

    with psycopg.connect(database_url) as conn:  # EXPLAIN only: nothing is claimed
        plan = "\n".join(
            r[0]
            for r in conn.execute(
                "EXPLAIN " + QUERIES["claim"], {"queue": "indexing", "limit": 16, "worker": "w"}
            ).fetchall()
        )
    assert any(index in plan for index in READY_INDEXES), plan


def test_a_backlog_of_mixed_priorities_is_claimed_by_an_index_scan_in_rank_order(app, database_url):
    sql(
        database_url,
        "INSERT INTO conveyor_jobs (id, queue, job, message, priority, rank_lead, available_at) "
        "SELECT 'p-' || i, 'indexing', 'test.probe.indexing', '{}', i % 10, (i % 10) * 60.0, "
        "now() - make_interval(secs => i) FROM generate_series(1, 20000) i",
    )
    sql(database_url, "ANALYZE conveyor_jobs")
    from conveyor.brokers.postgres import QUERIES

    with psycopg.connect(database_url) as conn:  # EXPLAIN only: nothing is claimed
        plan = "\n".join(
            r[0]
            for r in conn.execute(
                "EXPLAIN " + QUERIES["claim"], {"queue": "indexing", "limit": 16, "worker": "w"}
            ).fetchall()
        )
        assert any(index in plan for index in READY_INDEXES) and "Sort" not in plan, plan
        # One index of waiting rows in claim order is written by every enqueue, not two (0076).
        assert conn.execute("SELECT to_regclass('conveyor_jobs_ready')").fetchone()[0] is None
        # The trigger ranked every row: available time minus priority x aging.
        off = conn.execute(
            "SELECT count(*) FROM conveyor_jobs WHERE rank_at <> available_at - make_interval(secs => priority * 60.0)"
        ).fetchone()[0]
        assert off == 0
        conn.execute("UPDATE conveyor_jobs SET available_at = available_at + interval '1 hour' WHERE id = 'p-9'")
        moved = conn.execute("SELECT rank_at = available_at - interval '9 minutes' FROM conveyor_jobs WHERE id = 'p-9'")
        assert moved.fetchone()[0], "a moved available time re-ranks the row"


def test_start_of_a_deleted_job_returns_zero(app, database_url):
    ref = app.jobs.enqueue("test.probe.indexing", {"token": "deleted"})
    consumer = app.broker.consume("indexing", prefetch=1, timeout=1000)
    try:
        message = next(consumer)
        sql(database_url, "DELETE FROM conveyor_jobs WHERE id = %s", (ref.id,))
        assert app.broker.start_job(message) == 0
    finally:
        consumer.close()


def test_a_cancel_committed_while_the_start_waits_on_the_row_ends_the_job_cancelled(app, database_url):
    """The start meets a cancel of its prefetched job that commits while the start waits for the row
    (found by the fault campaign, issues 18/21): it ends the job cancelled, never "deleted", whose
    ack would then have completed a job that never ran."""
    from conveyor.brokers.base import CANCELLED_AT_START

    ref = app.jobs.enqueue("test.probe.indexing", {"token": "cancel-race"})
    consumer = app.broker.consume("indexing", prefetch=1, timeout=1000)
    try:
        message = next(consumer)
        started: list[int] = []
        with psycopg.connect(database_url) as cancel:  # what cancel_job writes for a held job, not committed yet
            cancel.execute("UPDATE conveyor_jobs SET cancel_requested_at = now() WHERE id = %s", (ref.id,))
            start = threading.Thread(target=lambda: started.append(app.broker.start_job(message)))
            start.start()
            wait_for(
                lambda: sql(
                    database_url,
                    "SELECT 1 FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE '%%started_delivery%%'",
                ),
                timeout=10,
                message="the start to wait for the row",
            )
            cancel.commit()
        start.join(10)
        assert started == [CANCELLED_AT_START]
        consumer.ack(message)  # what Dramatiq does after the skip: it changes nothing
    finally:
        consumer.close()
    record = app.broker.get_job(ref.id)
    assert (record.state, record.attempts) == ("cancelled", 0)


def test_the_start_of_a_job_is_a_hot_update(app, database_url):
    """Of a job row's three updates only the start changes no indexed column (claim and outcome change
    `status`, which the partial indexes' predicates read): it must stay HOT, so it adds no entry to any
    index and its old version is pruned on its page, not left for a vacuum (migration 0079,
    bench/pg_bloat.py). An index over anything the start writes would make every start a full copy."""
    from conveyor.brokers.postgres.jobs import QUERIES

    ref = app.jobs.enqueue("test.probe.indexing", {"token": "hot-start"})
    consumer = app.broker.consume("indexing", prefetch=1, timeout=1000)
    try:
        next(consumer)
        (delivery,) = sql(database_url, "SELECT delivery FROM conveyor_jobs WHERE id = %s", (ref.id,))[0]
        with psycopg.connect(database_url) as conn:  # one transaction: its own counters, read before commit
            assert conn.execute(QUERIES["start"], {"id": ref.id, "delivery": delivery}).fetchone() == (1,)
            updated, hot = conn.execute(
                "SELECT pg_stat_get_xact_tuples_updated(c.oid), pg_stat_get_xact_tuples_hot_updated(c.oid) "
                "FROM pg_class c WHERE c.relname = 'conveyor_jobs'"
            ).fetchone()
        assert (updated, hot) == (1, 1)
    finally:
        consumer.close()


# -- wake-ups -------------------------------------------------------------------------


def test_job_inserted_without_a_notification_is_picked_up_by_the_poll(make_app, database_url):
    app = make_app(pg_poll_seconds=1)
    with running(app, "critical"):
        first = app.jobs.enqueue("test.probe.critical", {"token": "warm-up"})
        wait_for(lambda: finished(app, first.id), timeout=10)
        job_id = str(uuid.uuid4())
        raw_insert_id = sql(
            database_url,
            "INSERT INTO conveyor_jobs (id, queue, job, message) VALUES (%s, 'critical', 'test.probe.critical', "
            "%s::jsonb) RETURNING id",
            (job_id, probe_message(job_id, "critical", "silent")),
        )[0][0]
        record = wait_for(lambda: finished(app, raw_insert_id), timeout=10, message="the poll to find the row")
    assert record.state == "completed"
    assert [r["job_id"] for r in probe_runs(database_url, "silent")] == [job_id]


# -- transactional enqueue -------------------------------------------------------------------


def test_enqueue_in_a_rolled_back_transaction_leaves_no_job(app, database_url):
    with psycopg.connect(database_url) as conn:
        with conn.transaction():
            ref = app.jobs.enqueue("test.probe.critical", {"token": "rolled-back"}, key="tx:1", connection=conn)
            assert app.broker.get_job(ref.id) is None, "invisible until the transaction commits"
            raise psycopg.Rollback()
    assert app.broker.get_job(ref.id) is None
    assert not app.jobs.enqueue("test.probe.critical", {"token": "again"}, key="tx:1").deduplicated


def test_enqueue_in_a_committed_transaction_runs_exactly_once(make_app, database_url):
    app = make_app(pg_poll_seconds=60)  # only the NOTIFY sent at commit can wake the worker in time
    with running(app, "critical"):
        warm = app.jobs.enqueue("test.probe.critical", {"token": "warm-up"})
        wait_for(lambda: finished(app, warm.id), timeout=10)
        with psycopg.connect(database_url) as conn:
            with conn.transaction():
                conn.execute("INSERT INTO probe_dead (job_id, error) VALUES ('tx-marker', 'same transaction')")
                ref = app.jobs.enqueue("test.probe.critical", {"token": "committed"}, key="tx:2", connection=conn)
                again = app.jobs.enqueue("test.probe.critical", {"token": "committed"}, key="tx:2", connection=conn)
        record = wait_for(lambda: finished(app, ref.id), timeout=10, message="the committed job")
    assert record.state == "completed"
    assert again == type(again)(ref.id, True)
    assert len(probe_runs(database_url, "committed")) == 1
    assert sql(database_url, "SELECT count(*) FROM probe_dead WHERE job_id = 'tx-marker'") == [(1,)]


def test_transactional_enqueue_is_refused_by_brokers_outside_postgres(clean_env, database_url):
    app = App(make_settings("inline", None, database_url))
    with psycopg.connect(database_url) as conn, pytest.raises(TransactionalEnqueueUnsupported, match="postgres"):
        app.jobs.enqueue("test.probe.critical", {"token": "x"}, connection=conn)


# -- recovery ------------------------------------------------------------------------------------


def _strand(database_url: str, ids: list[str], worker: str, heartbeat_age: str, *, spent: bool = False) -> None:
    """Make ``ids`` held by ``worker``, whose last heartbeat was ``heartbeat_age`` ago."""
    sql(
        database_url,
        "INSERT INTO conveyor_workers (id, hostname, pid, heartbeat_at) "
        "VALUES (%s, 'test', 0, now() - %s::interval) ON CONFLICT (id) DO NOTHING",
        (worker, heartbeat_age),
    )
    sql(
        database_url,
        "UPDATE conveyor_jobs SET status = 'in_progress', worker_id = %s, delivery = 1, "
        "picked_at = now(), attempt = CASE WHEN %s THEN max_attempts ELSE 1 END WHERE id = ANY(%s)",
        (worker, spent, ids),
    )


def test_two_replicas_recovering_at_once_take_each_stuck_row_once(make_app, database_url):
    first, second = make_app(), make_app()
    # Each has watched the server's clock for a lease (a fresh process declares nobody dead before).
    for app in (first, second):
        app.broker.recover()
    time.sleep(first.broker.recovery.lease * 1.2)
    refs = first.jobs.enqueue_many([{"job": "test.probe.nudge", "payload": {"token": f"stuck-{i}"}} for i in range(60)])
    ids = [r.id for r in refs]
    spent, retry, alive = ids[:10], ids[10:50], ids[50:]
    _strand(database_url, spent, "dead-worker", "1 hour", spent=True)
    _strand(database_url, retry, "dead-worker", "1 hour")
    _strand(database_url, alive, "live-worker", "0 seconds")

    results, barrier = {}, threading.Barrier(2)

    def run(name, app):
        barrier.wait()
        results[name] = app.broker.maintain()

    threads = [threading.Thread(target=run, args=(n, a)) for n, a in (("first", first), ("second", second))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()

    requeued = [job_id for result in results.values() for job_id in result.get("nudge", [])]
    assert sorted(requeued) == sorted(spent + retry), "each stuck row is handed back exactly once"
    rows = sql(database_url, "SELECT id, status, final_failure_at IS NOT NULL FROM conveyor_jobs")
    states = {i: (status, claimed) for i, status, claimed in rows}
    assert {states[i] for i in spent} == {("pending", True)}, "a spent row's hooks are claimed, to run in a worker"
    assert {states[i] for i in retry} == {("pending", False)}
    assert {states[i][0] for i in alive} == {"in_progress"}, "a live worker's rows are left alone"
    counts = first.broker.queue_counts("nudge")
    assert (counts.waiting, counts.active, counts.failed, counts.failed_total) == (50, 10, 0, 0)
    assert "WorkerLost" in first.broker.get_job(spent[0]).error
    with running(first, "nudge"):
        wait_for(lambda: len(probe_dead(database_url)) == len(spent), message="the spent rows' hooks")
        wait_for(lambda: first.broker.queue_counts("nudge").failed == len(spent), message="spent rows failed")
    dead = probe_dead(database_url)
    assert sorted(d["job_id"] for d in dead) == sorted(spent), "each spent row's hook runs exactly once"
    assert all("WorkerLost" in d["error"] for d in dead)
    assert not probe_runs(database_url, "stuck-" + "0"), "a spent row's body never runs again"


def test_prune_deletes_only_finished_rows_older_than_the_retention(make_app, database_url):
    app = make_app(retention=3600)
    old_done, old_failed, new_done, waiting = (
        app.jobs.enqueue("test.probe.llm", {"token": f"p{i}"}).id for i in range(4)
    )
    sql(
        database_url,
        "UPDATE conveyor_jobs SET status = 'done', completed_at = now() - interval '2 hours' WHERE id = %s",
        (old_done,),
    )
    sql(
        database_url,
        "UPDATE conveyor_jobs SET status = 'failed', completed_at = now() - interval '2 hours' WHERE id = %s",
        (old_failed,),
    )
    sql(database_url, "UPDATE conveyor_jobs SET status = 'done', completed_at = now() WHERE id = %s", (new_done,))
    assert app.broker.prune() == 2
    assert sorted(r[0] for r in sql(database_url, "SELECT id FROM conveyor_jobs")) == sorted([new_done, waiting])


def test_prune_reaches_every_queue_and_finished_state(make_app, database_url):
    # The prune walks the history index queue by queue (a skip scan): each queue's old rows go,
    # done, failed and cancelled alike, and a young row on the same queue stays.
    app = make_app(retention=3600)
    old = {
        "done": app.jobs.enqueue("test.probe.llm", {"token": "a"}).id,
        "failed": app.jobs.enqueue("test.probe.critical", {"token": "b"}).id,
        "cancelled": app.jobs.enqueue("test.probe.nudge", {"token": "c"}).id,
    }
    young = app.jobs.enqueue("test.probe.critical", {"token": "d"}).id
    for status, job_id in old.items():
        sql(
            database_url,
            "UPDATE conveyor_jobs SET status = %s, completed_at = now() - interval '2 hours' WHERE id = %s",
            (status, job_id),
        )
    sql(database_url, "UPDATE conveyor_jobs SET status = 'done', completed_at = now() WHERE id = %s", (young,))
    assert app.broker.prune() == 3
    assert [r[0] for r in sql(database_url, "SELECT id FROM conveyor_jobs")] == [young]


def test_a_prune_pass_that_ends_on_a_full_batch_prunes_again_at_the_next_maintenance(
    make_app, database_url, monkeypatch
):
    # Jobs finishing faster than a pass deletes them: the history must not wait a minute per pass.
    from conveyor.brokers.postgres import recovery

    monkeypatch.setattr(recovery, "BATCH", 1)
    monkeypatch.setattr(recovery, "BATCHES_PER_PASS", 2)
    app = make_app(retention=3600)
    ids = [app.jobs.enqueue("test.probe.llm", {"token": f"p{i}"}).id for i in range(5)]
    sql(
        database_url,
        "UPDATE conveyor_jobs SET status = 'done', completed_at = now() - interval '2 hours' WHERE id = ANY(%s)",
        (ids,),
    )
    app.broker.maintain()  # a full pass: 2 of 5
    assert sql(database_url, "SELECT count(*) FROM conveyor_jobs")[0][0] == 3
    app.broker.maintain()  # behind: at once again, not a minute later
    app.broker.maintain()  # the last one; the pass is short: caught up
    assert sql(database_url, "SELECT count(*) FROM conveyor_jobs")[0][0] == 0
    ids = [app.jobs.enqueue("test.probe.llm", {"token": f"q{i}"}).id for i in range(2)]
    sql(database_url, "UPDATE conveyor_jobs SET status = 'done', completed_at = now() - interval '2 hours'")
    app.broker.maintain()  # caught up: the next pass waits its minute
    assert sql(database_url, "SELECT count(*) FROM conveyor_jobs")[0][0] == 2


def test_attempts_prune_by_their_start_else_their_end_and_catch_up_when_behind(make_app, database_url, monkeypatch):
    from conveyor.brokers.fleet import fleet_store, postgres_store

    monkeypatch.setattr(postgres_store, "PRUNE_BATCH", 1)
    monkeypatch.setattr(postgres_store, "PRUNE_BATCHES", 1)
    app = make_app(retention=3600)
    sql(
        database_url,
        """INSERT INTO conveyor_job_attempts (job_id, token, attempt, worker, started_at, ended_at, outcome) VALUES
           ('old-1', 't', 1, 'w', now() - interval '3 hours', now() - interval '3 hours', 'done'),
           ('old-2', 't', 1, 'w', now() - interval '2 hours', NULL, NULL),
           ('ended-only', 't', 1, 'w', NULL, now() - interval '2 hours', 'failed'),
           ('started-young', 't', 1, 'w', now(), now() - interval '2 hours', 'done'),
           ('ended-young', 't', 1, 'w', NULL, now(), 'done')""",
    )
    store = fleet_store(app)
    for _ in range(3):  # each pass ends on a full batch: the next beat prunes again
        store.sweep(3600)
    left = sorted(r[0] for r in sql(database_url, "SELECT job_id FROM conveyor_job_attempts"))
    assert left == ["ended-young", "started-young"]


def test_next_due_says_runnable_delayed_or_nothing_whatever_waits_ahead(make_app, database_url):
    # Asked after a short claim: 0 (or less) when a job is runnable, else the seconds to the next
    # delayed one, None for an empty or paused queue. Found at the head of the pending index, not
    # by reading every pending row (a million waiting made that 0.7 s a call).
    app = make_app()
    jobs = app.broker.jobs
    assert jobs.next_due("llm") is None
    app.jobs.enqueue("test.probe.llm", {"token": "later"}, delay=60)
    assert 55 < jobs.next_due("llm") <= 60
    sql(
        database_url,
        "UPDATE conveyor_jobs SET rank_lead = 3600 WHERE queue = 'llm'",
    )  # aged ahead of everything (a priority lead): still not runnable before its time
    assert 55 < jobs.next_due("llm") <= 60
    app.jobs.enqueue("test.probe.llm", {"token": "now"})
    assert jobs.next_due("llm") <= 0
    jobs.pause("llm")
    assert jobs.next_due("llm") is None


def test_totals_survive_a_new_broker(make_app, database_url):
    app = make_app()
    with running(app, "critical"):
        ref = app.jobs.enqueue("test.probe.critical", {"token": "counted"})
        wait_for(lambda: finished(app, ref.id))
    app.close()
    assert make_app().broker.queue_counts("critical").completed_total == 1
