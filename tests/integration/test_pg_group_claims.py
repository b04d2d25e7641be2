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
    params = {"queue": QUEUE, "limit": 2, "worker": "the-other-claimer", "cap": cap}
    groups = [r[0] for r in conn.execute(QUERIES[groups_query], params)]
    assert groups, "the other claimer found no group to serve"
    claimed = conn.execute(QUERIES["claim_groups"], {**params, "groups": groups}).fetchall()
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
