"""The Postgres broker's grouped claim inside one process: who waits on whom, and how often it claims.

A claimer that holds its transaction open is a real second connection running the
broker's own statements (jobs.sql), not a mock. The acceptance tests
(tests/acceptance/test_pg_groups.py) check fair shares and caps with real workers.
"""

from __future__ import annotations

import threading
import time

import psycopg
import pytest

from conveyor.app import App
from conveyor.brokers.postgres import QUERIES
from conveyor.brokers.postgres.consumer import GROUPED_RECHECK
from tests.support.harness import FAST_QUEUES, make_settings

QUEUE = "indexing"


@pytest.fixture
def make_app(clean_env, database_url):
    apps = []

    def make(cap: int | None = None, **overrides) -> App:
        queues = {**FAST_QUEUES, QUEUE: {**FAST_QUEUES[QUEUE], "group_concurrency": cap}}
        app = App(make_settings("postgres", None, database_url, queues=queues, **overrides))
        apps.append(app)
        return app

    yield make
    for app in apps:
        app.close()


def enqueue(app: App, group: str, n: int) -> None:
    for i in range(n):
        app.jobs.enqueue(f"test.probe.{QUEUE}", {"token": f"{group}-{i}"}, group=group)


def claim_in_thread(app: App, limit: int, cap: int | None) -> tuple[threading.Thread, list]:
    got: list = []

    def run() -> None:
        got.append(app.broker.jobs.claim_groups(QUEUE, limit, synchronous=True, group_cap=cap))

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, got


def hold_a_claim(database_url: str, cap: int | None, groups_query: str) -> psycopg.Connection:
    """Another claimer's transaction, left open: the broker's rotation and claim statements, uncommitted."""
    conn = psycopg.connect(database_url)  # not autocommit: the transaction stays open until rollback
    params = {"queue": QUEUE, "limit": 2, "worker": "the-other-claimer", "cap": cap, "configured": None}
    turns = conn.execute(QUERIES[groups_query], params).fetchall()
    assert turns, "the other claimer found no group to serve"
    picks = {"groups": [t[0] for t in turns], "starts": [t[1] for t in turns], "weights": [t[2] for t in turns]}
    claimed = conn.execute(QUERIES["claim_groups"], {**params, **picks}).fetchall()
    assert claimed, "the other claimer claimed nothing"
    return conn


def test_uncapped_claimers_of_the_same_groups_neither_wait_on_nor_skip_each_other(make_app, database_url):
    app = make_app(cap=None)
    enqueue(app, "a", 4)
    enqueue(app, "b", 4)
    other = hold_a_claim(database_url, None, "pick_groups")  # moved both groups' rotation rows, uncommitted
    try:
        thread, got = claim_in_thread(app, 4, None)
        thread.join(10)
        assert not thread.is_alive(), "the claim waited on another claimer's open transaction (group locks)"
        assert len(got[0]) == 4, f"the claim skipped groups another claimer serves: {len(got[0])} of 4"
    finally:
        other.rollback()
        other.close()


def test_capped_claimers_take_turns_on_a_group(make_app, database_url):
    app = make_app(cap=5)
    enqueue(app, "a", 4)
    other = hold_a_claim(database_url, 5, "lock_groups")  # holds group a's lock while it counts its slots
    try:
        thread, got = claim_in_thread(app, 4, 5)
        thread.join(10)
        assert not thread.is_alive(), "a held group is skipped, not waited on"
        assert got[0] == [], "claimed jobs of a group whose slots another claimer counts"
    finally:
        other.rollback()
        other.close()
    # The other claimer is gone (rolled back): the group is this claimer's again, up to its room.
    assert len(app.broker.jobs.claim_groups(QUEUE, 4, synchronous=True, group_cap=5)) == 4


def test_a_capped_groups_short_claim_is_retried_after_the_recheck_not_in_a_spin(make_app):
    # No poll and no notification in the window: only the consumer's own re-claims count.
    app = make_app(cap=1, pg_poll_seconds=60)
    enqueue(app, "g", 3)
    jobs = app.broker.jobs
    calls: list[float] = []
    claim = jobs.claim

    def counted(*args, **kwargs):
        calls.append(time.monotonic())
        return claim(*args, **kwargs)

    jobs.claim = counted  # type: ignore[method-assign]
    window = 1.5
    consumer = app.broker.consume(QUEUE, prefetch=4, timeout=int(window * 1000))
    try:
        first = next(consumer)
        assert first is not None and first.options["pg_delivery"] == 1
        began = time.monotonic()
        assert next(consumer) is None, "a second job of the capped group was handed out"  # waits the window
        ended = time.monotonic()
    finally:
        consumer.close()
    inside = [t for t in calls if began <= t <= ended]
    most = int((ended - began) / GROUPED_RECHECK) + 2
    assert len(inside) <= most, f"{len(inside)} claims in {ended - began:.2f} s: the consumer spins"
    assert len(inside) >= 2, "the short claim was not retried within the window (it waited for the poll)"


# -- the groups' rows: pruned when idle, never under a job -------------------------------------


def sql(database_url: str, query: str, params=None) -> list[tuple]:
    with psycopg.connect(database_url, autocommit=True) as conn:
        cur = conn.execute(query, params)
        return cur.fetchall() if cur.description else []


def group_rows(database_url: str) -> set[str]:
    return {r[0] for r in sql(database_url, "SELECT job_group FROM conveyor_job_groups WHERE queue = %s", (QUEUE,))}


def end(database_url: str, ids, status: str = "done") -> None:
    sql(
        database_url,
        "UPDATE conveyor_jobs SET status = %s, completed_at = now(), worker_id = NULL WHERE id = ANY(%s)",
        (status, list(ids)),
    )


def stranded(database_url: str) -> list[tuple]:
    """Jobs to run whose named group has no row: no claim would ever serve them."""
    return sql(
        database_url,
        "SELECT j.id, j.job_group FROM conveyor_jobs j WHERE j.status IN ('pending', 'in_progress') "
        "AND j.job_group <> '' AND NOT EXISTS (SELECT 1 FROM conveyor_job_groups g "
        "WHERE g.queue = j.queue AND g.job_group = j.job_group)",
    )


def test_an_idle_groups_row_is_pruned_and_made_again_by_its_next_enqueue(make_app, database_url):
    app = make_app(cap=2)
    jobs = app.broker.jobs
    for group in ("done", "waiting", "running", "failed"):
        enqueue(app, group, 1)
    claimed = {r[0]: r for r in jobs.claim_groups(QUEUE, 4, synchronous=True, group_cap=2)}
    by_group = dict(sql(database_url, "SELECT job_group, id FROM conveyor_jobs"))
    sql(
        database_url,
        "UPDATE conveyor_jobs SET status = 'pending', worker_id = NULL WHERE id = %s",
        (by_group["waiting"],),
    )
    end(database_url, [by_group["done"]])
    end(database_url, [by_group["failed"]], "failed")
    assert by_group["running"] in claimed
    assert jobs.prune_groups(3600, 100) == 0, "served just now: not idle for an hour"
    assert jobs.prune_groups(0, 100) == 2
    assert group_rows(database_url) == {"", "waiting", "running"}, "a job to run or running keeps its group"
    # Its next job makes the group again; a failed job retried by an operator too.
    enqueue(app, "done", 1)
    assert app.broker.retry_job(by_group["failed"])
    assert group_rows(database_url) == {"", "waiting", "running", "done", "failed"}
    assert stranded(database_url) == []
    got = {r[0] for r in jobs.claim_groups(QUEUE, 10, synchronous=True, group_cap=2)}
    assert by_group["failed"] in got and len(got) == 3, "the waiting, the new and the retried job are claimed"


def test_the_maintenance_prune_takes_groups_idle_for_the_retention(make_app, database_url):
    app = make_app(cap=1, retention=0.05)
    enqueue(app, "gone", 1)
    enqueue(app, "kept", 1)
    end(database_url, [r[0] for r in app.broker.jobs.claim_groups(QUEUE, 1, synchronous=True, group_cap=1)])
    time.sleep(0.1)  # the retention (0.05 s) is over
    app.broker.prune()
    assert group_rows(database_url) == {"", "kept"}


def test_the_prune_passes_over_a_group_an_uncommitted_enqueue_holds(make_app, database_url):
    app = make_app(cap=1)
    enqueue(app, "g", 1)
    end(database_url, [r[0] for r in app.broker.jobs.claim_groups(QUEUE, 1, synchronous=True, group_cap=1)])
    with psycopg.connect(database_url) as conn:
        with conn.transaction():
            ref = app.jobs.enqueue(f"test.probe.{QUEUE}", {"token": "in-flight"}, group="g", connection=conn)
            # The enqueue's job is not committed, so the prune cannot see it: it must not take the row.
            assert app.broker.jobs.prune_groups(0, 100) == 0
    assert "g" in group_rows(database_url) and stranded(database_url) == []
    assert [r[0] for r in app.broker.jobs.claim_groups(QUEUE, 1, synchronous=True, group_cap=1)] == [ref.id]


def _waiting_on_a_lock(database_url: str, application: str) -> bool:
    return bool(
        sql(
            database_url,
            "SELECT 1 FROM pg_stat_activity WHERE application_name = %s AND wait_event_type = 'Lock'",
            (application,),
        )
    )


def test_an_enqueue_into_a_group_the_prune_is_deleting_makes_it_again(make_app, database_url):
    app = make_app(cap=1)
    enqueue(app, "g", 1)
    end(database_url, [r[0] for r in app.broker.jobs.claim_groups(QUEUE, 1, synchronous=True, group_cap=1)])
    pruner = psycopg.connect(database_url)  # the prune's transaction, its two statements run by hand
    idle = pruner.execute(QUERIES["lock_idle_groups"], {"idle": 0, "limit": 100}).fetchall()
    assert idle == [(QUEUE, "g")]
    committed = threading.Event()
    refs: list = []

    def enqueue_in_a_transaction() -> None:
        with psycopg.connect(database_url, application_name="the-enqueuer") as conn:
            with conn.transaction():
                refs.append(app.jobs.enqueue(f"test.probe.{QUEUE}", {"token": "late"}, group="g", connection=conn))
                committed.wait(10)  # still uncommitted while the prune deletes

    thread = threading.Thread(target=enqueue_in_a_transaction, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 3
        while not _waiting_on_a_lock(database_url, "the-enqueuer") and time.monotonic() < deadline:
            time.sleep(0.02)
        deleted = pruner.execute(
            QUERIES["prune_groups"], {"queues": [r[0] for r in idle], "groups": [r[1] for r in idle]}
        ).rowcount
        pruner.commit()
        assert deleted == 1
    finally:
        pruner.close()
        committed.set()
        thread.join(10)
    assert refs and not thread.is_alive()
    assert stranded(database_url) == [], "a job was left without its group: no claim serves it"
    assert [r[0] for r in app.broker.jobs.claim_groups(QUEUE, 1, synchronous=True, group_cap=1)] == [refs[0].id]


@pytest.mark.timeout(120)
def test_enqueues_claims_and_prunes_at_once_strand_no_job_and_keep_the_cap(make_app, database_url):
    # Many groups, each mostly empty (so the prunes take its row) while enqueues keep adding to it.
    cap, groups, rounds = 2, [f"t{i}" for i in range(24)], 60
    app = make_app(cap=cap)
    stop = threading.Event()
    errors: list[BaseException] = []
    peaks: list[int] = []
    enqueued: list[str] = []
    orphans: list[tuple] = []

    def guarded(body):
        def run() -> None:
            try:
                body()
            except BaseException as exc:  # reported by the test, not lost in the thread
                errors.append(exc)
                stop.set()

        return run

    def producer(seed: int) -> None:
        for i in range(rounds):
            group = groups[(seed * 7 + i) % len(groups)]
            if i % 2 == 0:  # in a transaction that stays open a moment: the prune's window
                with psycopg.connect(database_url) as conn, conn.transaction():
                    ref = app.jobs.enqueue(
                        f"test.probe.{QUEUE}", {"token": f"{seed}-{i}"}, group=group, connection=conn
                    )
                    time.sleep(0.01)
            else:
                ref = app.jobs.enqueue(f"test.probe.{QUEUE}", {"token": f"{seed}-{i}"}, group=group)
            enqueued.append(ref.id)

    def claimer() -> None:
        while not stop.is_set():
            got = app.broker.jobs.claim_groups(QUEUE, 3, synchronous=True, group_cap=cap)
            held = sql(
                database_url,
                "SELECT coalesce(max(n), 0) FROM (SELECT count(*) AS n FROM conveyor_jobs "
                "WHERE queue = %s AND status = 'in_progress' AND job_group <> '' GROUP BY job_group) c",
                (QUEUE,),
            )[0][0]
            peaks.append(held)
            time.sleep(0.002)
            end(database_url, [r[0] for r in got])

    def pruner() -> None:
        while not stop.is_set():
            app.broker.jobs.prune_groups(0, 100)

    def watcher() -> None:
        # The next enqueue into a group makes its row again, so a stranded job is seen while it lasts.
        while not stop.is_set():
            orphans.extend(stranded(database_url))
            time.sleep(0.005)

    producers = [threading.Thread(target=guarded(lambda s=s: producer(s)), daemon=True) for s in range(3)]
    others = [threading.Thread(target=guarded(f), daemon=True) for f in (claimer, claimer, pruner, pruner, watcher)]
    for thread in producers + others:
        thread.start()
    for thread in producers:
        thread.join(90)
    # Everything enqueued is claimed and ended, the prunes still running.
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not stop.is_set():
        left = sql(database_url, "SELECT count(*) FROM conveyor_jobs WHERE status <> 'done'")[0][0]
        if left == 0:
            break
        time.sleep(0.1)
    stop.set()
    for thread in others:
        thread.join(30)
    assert not errors, errors
    assert len(enqueued) == 3 * rounds
    assert orphans == [] and stranded(database_url) == [], f"jobs left without their group: {orphans[:5]}"
    left = sql(database_url, "SELECT id, status, job_group FROM conveyor_jobs WHERE status <> 'done'")
    assert left == [], f"{len(left)} job(s) never claimed (stranded without their group?): {left[:5]}"
    assert max(peaks) <= cap, f"a group held {max(peaks)} jobs at once, over its cap of {cap}"


def test_an_uncommitted_enqueue_into_a_group_does_not_hold_back_its_claims(make_app, database_url):
    app = make_app(cap=1)
    enqueue(app, "g", 1)
    served = "SELECT isfinite(last_served) FROM conveyor_job_groups WHERE job_group = 'g'"
    assert sql(database_url, served) == [(False,)], "never served: '-infinity'"
    with psycopg.connect(database_url) as conn:
        with conn.transaction():
            app.jobs.enqueue(f"test.probe.{QUEUE}", {"token": "open"}, group="g", connection=conn)
            # The enqueue holds g's row (FOR KEY SHARE) till it commits; a claimer still counts g's slots.
            thread, got = claim_in_thread(app, 2, 1)
            thread.join(10)
            assert not thread.is_alive(), "the claim waited on an open enqueue"
            assert len(got[0]) == 1, "the claim passed over a group an enqueue was adding to"
    assert sql(database_url, served) == [(True,)], "the group served did not move to the back of the rotation"
