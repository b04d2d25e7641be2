"""Budgets (issue 21, item 3): weighted rate limits kept fleet-wide, on Redis and on Postgres.

Two worker processes (``conveyor worker --processes 2``, four threads each) run
jobs whose weights a budget of LIMIT per PER seconds, keyed by tenant, admits;
the test reads when the store admitted each weight, on the store's own clock.
Over every window of PER seconds starting at an admission, the weight admitted
stays within LIMIT (the issue's bound is LIMIT plus one job's weight); throttled jobs were deferred (RetryLater), not failed, on a queue
of one attempt. A job's ``ctx.spend`` after the fact delays the job that follows.
"""

from __future__ import annotations

import contextlib
import random
import threading
import time
from collections.abc import Iterator

import psycopg
import pytest
import redis

from conveyor.app import App
from conveyor.middleware.metrics import find_metrics
from conveyor.platform.settings import PlatformSettings
from tests.support import budget_jobs
from tests.support.brokers import SERVER_BROKERS
from tests.support.harness import make_settings, running
from tests.support.waiting import wait_for

#: Jobs in the load test, and their weights' range.
JOBS = 60
MAX_WEIGHT = 4
#: Seconds between the later jobs' enqueues (a producer's pace, not a wait for an outcome).
ARRIVAL_GAP = 0.1


@pytest.fixture(params=SERVER_BROKERS)
def settings(request, clean_env, database_url):
    redis_url = request.getfixturevalue("redis_url") if request.param == "redis" else None
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(budget_jobs.TABLE)
        conn.execute(AUDIT)
    return make_settings(request.param, redis_url, database_url, imports="tests.support.budget_jobs")


#: Every weight the Postgres store admits, with its own timestamp (its rows are deleted once expired).
AUDIT = """
CREATE TABLE IF NOT EXISTS budget_audit (key TEXT, at TIMESTAMPTZ, weight FLOAT8);
CREATE OR REPLACE FUNCTION budget_audit() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN INSERT INTO budget_audit VALUES (NEW.key, NEW.at, NEW.weight); RETURN NEW; END $$;
CREATE OR REPLACE TRIGGER budget_audit AFTER INSERT ON conveyor_budget_entries
FOR EACH ROW EXECUTE FUNCTION budget_audit();
"""


def admitted_in_postgres(database_url: str) -> list[dict]:
    with psycopg.connect(database_url) as conn:
        cur = conn.execute("SELECT extract(epoch FROM at)::float8, weight FROM budget_audit ORDER BY at")
        return [{"at": at, "weight": w} for at, w in cur.fetchall()]


@contextlib.contextmanager
def redis_admissions(url: str, namespace: str, budget_key: str) -> Iterator[dict[str, float]]:
    """Every member the Redis store's window of ``budget_key`` held, with its score (ms, Redis's clock): read
    ten times per window, while each member stays at least a window."""
    client = redis.Redis.from_url(url)
    key = f"{namespace}:budget:{budget_key}"
    seen: dict[str, float] = {}
    stop = threading.Event()

    def read() -> None:
        seen.update({m.decode(): s for m, s in client.zrange(key, 0, -1, withscores=True)})

    def watch() -> None:
        while not stop.wait(budget_jobs.PER / 10):
            read()

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        yield seen
    finally:
        stop.set()
        watcher.join()
        read()  # the last admissions, made since the watcher's last read
        client.close()


def runs(database_url: str, token: str) -> list[dict]:
    with psycopg.connect(database_url) as conn:
        cur = conn.execute(
            "SELECT job_id, weight, attempt, deferrals, extract(epoch FROM at)::float8, "
            "extract(epoch FROM spent_at)::float8 FROM budget_runs WHERE token = %s ORDER BY at",
            (token,),
        )
        keys = ("job_id", "weight", "attempt", "deferrals", "at", "spent_at")
        return [dict(zip(keys, row)) for row in cur.fetchall()]


def worst_window(rows: list[dict], per: float) -> float:
    """The most weight that ran in any window of ``per`` seconds (each window starting at a run)."""
    return max(sum(r["weight"] for r in rows if start["at"] <= r["at"] < start["at"] + per) for start in rows)


def test_a_budget_admits_at_most_its_limit_plus_one_job_per_window_across_two_processes(
    app: App, settings, workers, database_url
):
    rng = random.Random(21)
    token = f"load-{settings.broker_name}"
    weights = [rng.randint(1, MAX_WEIGHT) for _ in range(JOBS)]
    with contextlib.ExitStack() as stack:
        seen = (
            stack.enter_context(
                redis_admissions(settings.redis_url, settings.redis_namespace, budget_jobs.WEIGHED.name + ":a")
            )
            if settings.broker_name == "redis"
            else {}
        )
        workers("budgeted", processes=2)
        # Half the jobs at once, the rest arriving one by one: fresh jobs ask at every moment of a window,
        # not only when the throttled ones come back.
        refs = [
            app.jobs.enqueue("test.budget.weighed", {"token": token, "tenant": "a", "weight": w})
            for w in weights[: JOBS // 2]
        ]
        for w in weights[JOBS // 2 :]:
            time.sleep(ARRIVAL_GAP)
            refs.append(app.jobs.enqueue("test.budget.weighed", {"token": token, "tenant": "a", "weight": w}))
        rows = wait_for(
            lambda: found if len(found := runs(database_url, token)) >= JOBS else None,
            timeout=120,
            message="every budgeted job to run",
        )
    assert sorted(r["job_id"] for r in rows) == sorted(ref.id for ref in refs), "each job ran once"
    # Measured on the store's own clock: when the limiter admitted each weight.
    if settings.broker_name == "redis":
        admitted = [{"at": at / 1000, "weight": float(m.split("|")[0])} for m, at in seen.items()]
    else:
        admitted = admitted_in_postgres(database_url)
    worst = worst_window(admitted, budget_jobs.PER)
    print(
        f"budget overshoot on {settings.broker_name}: {worst - budget_jobs.LIMIT:g} (worst window {worst:g}, "
        f"limit {budget_jobs.LIMIT}, max weight {MAX_WEIGHT}; by the jobs' own run times: "
        f"{worst_window(rows, budget_jobs.PER):g})"
    )
    # The bound is the limit plus one job's weight; weights within the limit keep the limit itself.
    assert worst <= budget_jobs.LIMIT, admitted
    assert sum(a["weight"] for a in admitted) == sum(weights), "every admission was seen"
    # The load needs ~sum/LIMIT windows: most jobs were throttled, and none spent an attempt on it.
    span = rows[-1]["at"] - rows[0]["at"]
    assert span >= (sum(weights) / budget_jobs.LIMIT - 2) * budget_jobs.PER, span
    assert sum(1 for r in rows if r["deferrals"]) > JOBS / 2
    assert all(r["attempt"] == r["deferrals"] + 1 for r in rows), "a throttled start is the only kind here"
    # A body's run row is written before its ack, which a worker sends batched: wait for the acks too.
    wait_for(
        lambda: all(app.jobs.get(ref.id).state == "completed" for ref in refs),
        timeout=30,
        message="every budgeted job's ack",
    )


def test_a_spend_reported_after_the_call_delays_the_next_job(app: App, settings, workers, database_url):
    token = f"spend-{settings.broker_name}"
    workers("budgeted", processes=2)
    app.jobs.enqueue(
        "test.budget.reported", {"token": token, "tenant": "b", "weight": 0, "spend": budget_jobs.REPORTED_LIMIT}
    )
    first = wait_for(lambda: (r := runs(database_url, token)) and r[0]["spent_at"] and r[0], timeout=60)
    # Another tenant's budget is its own: it runs at once.
    other = f"{token}-other"
    app.jobs.enqueue("test.budget.reported", {"token": other, "tenant": "c", "weight": 0})
    app.jobs.enqueue("test.budget.reported", {"token": token, "tenant": "b", "weight": 0})
    rows = wait_for(lambda: r if len(r := runs(database_url, token)) == 2 else None, timeout=60)
    second = rows[1]
    assert second["deferrals"] >= 1, "the second job was throttled"
    assert second["at"] - first["spent_at"] >= budget_jobs.REPORTED_PER * 0.9, rows
    (unrelated,) = runs(database_url, other)
    assert unrelated["deferrals"] == 0 and unrelated["at"] < second["at"]


def test_throttled_jobs_are_counted_per_budget_and_complete_on_the_inline_broker(clean_env, database_url):
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(budget_jobs.TABLE)
    app = App(make_settings("inline", None, database_url, imports="tests.support.budget_jobs"))
    try:
        token = "inline"
        with running(app, "budgeted"):
            app.jobs.enqueue(
                "test.budget.reported",
                {"token": token, "tenant": "d", "weight": 0, "spend": budget_jobs.REPORTED_LIMIT},
            )
            wait_for(lambda: (r := runs(database_url, token)) and r[0]["spent_at"], timeout=30)
            second = app.jobs.enqueue("test.budget.reported", {"token": token, "tenant": "d", "weight": 0})
            wait_for(lambda: len(runs(database_url, token)) == 2, timeout=30)
        assert app.jobs.get(second.id).state == "completed"
        metrics = find_metrics(app.broker)
        labels = {"budget": "test-reported", "queue": "budgeted", "job": "test.budget.reported"}
        assert metrics.registry.get_sample_value("conveyor_budget_throttled_total", labels) >= 1
        waited = metrics.registry.get_sample_value("conveyor_budget_wait_seconds_total", labels)
        assert waited >= budget_jobs.REPORTED_PER * 0.5
    finally:
        app.close()


@pytest.mark.parametrize("broker", SERVER_BROKERS)
def test_the_platforms_provider_rate_limit_is_a_budget_that_delays_the_next_extraction(
    clean_env, broker, request, database_url
):
    from tests.support.platform_support import completed_round
    from tests.support.platform_support import workers as platform_workers

    redis_url = request.getfixturevalue("redis_url") if broker == "redis" else None
    app = App(
        make_settings(broker, redis_url, database_url, platform=True),
        blueprint_settings=[PlatformSettings(provider_rate_limit=1, provider_rate_window=1.5)],
    )
    try:
        refs = []
        for n in range(2):
            message_id = completed_round(
                app, task_id=f"t{n}", user_id="erin", question=f"question {n}", answer="an answer"
            )
            refs.append(
                app.jobs.enqueue("memory.extraction", {"user_id": "erin", "task_id": f"t{n}", "message_id": message_id})
            )
        with platform_workers(app, queues=("llm",)):
            wait_for(
                lambda: all(app.broker.get_job(r.id).state == "completed" for r in refs),
                timeout=60,
                message="both extractions to complete",
            )
        with app.pool.connection() as conn:
            (gap,) = conn.execute(
                "SELECT extract(epoch FROM max(started_at) - min(started_at))::float8 FROM memory_extractions"
            ).fetchone()
        assert gap >= 1.5 * 0.9, "one provider request per window: the second extraction waited for the first"
        assert app.broker.queue_counts("llm").failed_total == 0
    finally:
        app.close()
