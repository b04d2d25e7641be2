"""The dashboard charts' history: jobs run by a real in-process worker become per-minute rollup rows, on every broker.

Counts add up across processes (a second process's flush merges into the same
minute), a retried flush is not added twice, percentiles come out of the
merged buckets, old minutes are pruned, and the admin API serves it as JSON.
"""

from __future__ import annotations

import subprocess
import sys

import httpx
import pytest

from conveyor.brokers.rollup import Tally, TallyGroup, bucket_of, percentile, rollup_store
from conveyor.inspector import Inspector
from conveyor.middleware.rollup import find_rollup
from tests.support.brokers import ALL_BROKERS, SERVER_BROKERS
from tests.support.obs_support import TOKEN, api_server, cli_env, running
from tests.support.obs_support import broker_app as make_app
from tests.support.waiting import wait_for

QUEUE = "indexing"
JOB = "obs.work"


@pytest.fixture(params=ALL_BROKERS)
def broker_app(request):
    app = make_app(request, request.param, rollup_flush_seconds=0.2)
    yield app
    app.close()


@pytest.fixture(params=SERVER_BROKERS)
def server_app(request):
    app = make_app(request, request.param, rollup_flush_seconds=0.2)
    yield app
    app.close()


def _totals(app, job: str | None = None) -> dict[str, int]:
    return Inspector(app).history(QUEUE, "1h", job=job).totals


def test_jobs_run_by_a_worker_become_rollup_rows_with_their_counts_and_times(broker_app):
    app = broker_app
    for n in range(12):
        app.jobs.enqueue(JOB, {"n": n, "sleep": 0.05})
    for n in range(2):
        app.jobs.enqueue(JOB, {"n": 100 + n, "fail": True})  # 3 attempts: 2 retries, then failed for good
    with running(app, threads=4):
        wait_for(
            lambda: _totals(app) == {"enqueued": 14, "completed": 12, "failed": 2, "retried": 4},
            timeout=40,
            message="the rollup to count 14 enqueued, 12 completed, 2 failed for good, 4 retried",
        )
    history = Inspector(app).history(QUEUE, "1h")
    assert len(history.points) == 60 and history.step == 60
    ran = [p for p in history.points if p.run_p50 is not None]
    assert ran, "run times were recorded"
    # 12 of 18 attempts slept 50 ms: the median attempt ran about that long (buckets are ~19 % wide).
    merged = Tally()
    for row in rollup_store(app).read(QUEUE, 3600)[1]:
        if row.job == JOB:
            merged.add(row.tally)
    assert sum(merged.run) == 18 and sum(merged.wait) == 18
    assert 0.035 <= (percentile(merged.run, 0.5) or 0) <= 0.2
    assert (percentile(merged.wait, 0.95) or 0) < 30
    # Filtering by job type: a type that never ran has nothing.
    assert _totals(app, job="obs.leak") == {"enqueued": 0, "completed": 0, "failed": 0, "retried": 0}
    # The worker sampled the queue's depth at its first maintenance pass (not on the inline broker).
    if app.settings.broker_name != "inline":
        assert any(r.job == "" and r.depth is not None for r in rollup_store(app).read(QUEUE, 3600)[1])


def test_two_processes_flushes_add_up_in_the_same_minutes(server_app, clean_env):
    app = server_app
    for n in range(7):
        app.jobs.enqueue(JOB, {"n": n})
    rollup = find_rollup(app.broker)
    assert rollup is not None
    wait_for(lambda: _totals(app)["enqueued"] == 7, timeout=20, message="this process's 7 enqueues")
    # Another process enqueues 5 and exits at once: its last counts are flushed at exit.
    settings = app.settings
    env = cli_env(
        clean_env,
        CONVEYOR_BROKER=settings.broker_name,
        CONVEYOR_IMPORTS="tests.support.obs_jobs",
        CONVEYOR_ROLLUP_FLUSH_SECONDS="30",
        **({"REDIS_URL": settings.redis_url} if settings.redis_url else {}),
        **({"DATABASE_URL": settings.database_url} if settings.database_url else {}),
    )
    code = "from conveyor.app import App\napp = App()\nfor n in range(5): app.jobs.enqueue('obs.work', {'n': n})\n"
    subprocess.run([sys.executable, "-c", code], env=env, check=True, timeout=60)
    assert _totals(app)["enqueued"] == 12


def test_a_retried_flush_is_not_added_twice(server_app):
    store = rollup_store(server_app)
    tally = Tally(completed=3)
    tally.run[bucket_of(0.2)] = 3
    groups = [TallyGroup(QUEUE, JOB, 1.0, tally)]
    assert store.write("proc.1", groups) is True
    assert store.write("proc.1", groups) is False  # the same flush again: a timeout that had in fact landed
    assert store.write("proc.2", groups) is True
    assert _totals(server_app)["completed"] == 6


def test_counts_are_filed_under_the_servers_minute_by_their_age(server_app):
    store = rollup_store(server_app)
    now, _ = store.read(QUEUE, 3600)
    age = now % 60 + 90  # a minute and a half before this minute began: two minutes back
    store.write("aged", [TallyGroup(QUEUE, JOB, float(age), Tally(enqueued=4))])
    rows = [r for r in store.read(QUEUE, 3600)[1] if r.job == JOB]
    assert [(r.minute, r.tally.enqueued) for r in rows] == [(now - now % 60 - 120, 4)]


def test_minutes_older_than_a_day_are_pruned(server_app):
    store = rollup_store(server_app)
    store.write("old", [TallyGroup(QUEUE, JOB, 25 * 3600.0, Tally(enqueued=1))])
    store.write("new", [TallyGroup(QUEUE, JOB, 1.0, Tally(enqueued=2))])
    if server_app.settings.broker_name == "postgres":
        assert len(store.read(QUEUE, 2 * 86400)[1]) == 2
        assert store.prune() == 1
        assert [r.tally.enqueued for r in store.read(QUEUE, 2 * 86400)[1]] == [2]
    else:  # Redis: the old minute's hash expired as it was written; the new one expires in a day
        assert [r.tally.enqueued for r in store.read(QUEUE, 2 * 86400)[1]] == [2]
        client = server_app.broker.client  # type: ignore[attr-defined]
        keys = list(client.scan_iter(f"{server_app.broker.namespace}:rollup:{QUEUE}:*"))  # type: ignore[attr-defined]
        assert len(keys) == 1 and 86400 < client.ttl(keys[0]) <= 86400 + 180


def test_the_admin_api_serves_a_queues_history_as_json(broker_app):
    app = broker_app
    app.jobs.enqueue(JOB, {"n": 1})
    wait_for(lambda: _totals(app)["enqueued"] == 1, timeout=20, message="the enqueue counted")
    with api_server(app) as url, httpx.Client(base_url=url, timeout=10) as client:
        auth = {"Authorization": f"Bearer {TOKEN}"}
        body = client.get(f"/api/admin/queues/{QUEUE}/history?window=24h", headers=auth).json()
        assert body["window"] == "24h" and body["step"] == 300 and len(body["points"]) == 288
        assert sum(p["enqueued"] for p in body["points"]) == 1
        assert set(body["points"][0]) >= {"at", "completed", "failed", "retried", "waitP95", "runP50", "depth"}
        bad = client.get(f"/api/admin/queues/{QUEUE}/history?window=7d-evil", headers=auth)
        assert bad.status_code == 422 and "7d-evil" not in bad.text
        assert client.get("/api/admin/queues/nope/history", headers=auth).status_code == 404
        assert client.get(f"/api/admin/queues/{QUEUE}/history").status_code == 401


def test_with_the_flush_interval_at_zero_nothing_is_counted(request):
    app = make_app(request, "inline", rollup_flush_seconds=0)
    try:
        app.jobs.enqueue(JOB, {"n": 1})
        assert find_rollup(app.broker)._tallies == {}  # type: ignore[union-attr]
    finally:
        app.close()


@pytest.mark.parametrize("broker", SERVER_BROKERS)
@pytest.mark.parametrize("landed", [True, False], ids=["timed-out-but-landed", "never-landed"])
def test_a_failed_flush_is_kept_and_written_once_by_the_next(request, broker, landed):
    """A write that raised may have landed (a timeout after the server applied it) or not: either way the
    counts end up in the store exactly once."""
    from conveyor.brokers import rollup as rollup_package
    from conveyor.errors import StoreUnavailable

    app = make_app(request, broker, rollup_flush_seconds=60)  # no flush by itself
    try:
        rollup = find_rollup(app.broker)
        assert rollup is not None
        real = rollup_store(app)

        class Flaky:
            failures = 1

            def __getattr__(self, name):
                return getattr(real, name)

            def write(self, flush_id, groups):
                if self.failures:
                    self.failures -= 1
                    if landed:
                        real.write(flush_id, groups)
                    raise StoreUnavailable("the write timed out")
                return real.write(flush_id, groups)

        rollup_package._stores[app.broker] = Flaky()
        for n in range(3):
            app.jobs.enqueue(JOB, {"n": n})
        assert rollup.flush() is False
        app.jobs.enqueue(JOB, {"n": 3})  # counted while the failed flush waits
        assert rollup.flush() is True  # the kept flush, under its id
        assert rollup.flush() is True  # then what came after
        assert _totals(app)["enqueued"] == 4
    finally:
        app.close()


def test_the_pages_window_links_keep_known_filters_and_echo_nothing_else(request):
    app = make_app(request, "inline")
    try:
        with api_server(app) as url, httpx.Client(base_url=url, timeout=10) as client:
            auth = {"Authorization": f"Bearer {TOKEN}"}
            page = client.get(
                f"/admin/queues/{QUEUE}?state=failed&job={JOB}&window=24h&evil=<b>marker-7f3</b>", headers=auth
            )
            assert page.status_code == 200
            assert f'href="/admin/queues/{QUEUE}?state=failed&amp;job={JOB}&amp;window=1h"' in page.text
            assert 'data-window="24h">24h' in page.text and "marker-7f3" not in page.text
            odd = client.get("/admin/queues?window=7d-marker-9a1", headers=auth)
            assert odd.status_code == 200 and "marker-9a1" not in odd.text  # an unknown window is 1h
    finally:
        app.close()
