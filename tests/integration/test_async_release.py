"""Async jobs hold no worker thread while they await (issue 21.7), on Redis and Postgres.

Conveyor's worker (conveyor.tasks.releasing) starts an ``async def`` job's coroutine on the loop and goes
back for the next message; a finisher runs its end (hooks, ack). The queue's concurrency counts slots:
a queue of concurrency 100 runs 100 awaiting jobs on a few threads, and never more. The time limit,
the cancel, the retries and the drain still hold for a coroutine no thread waits for.
"""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from conveyor import App, JobContext, Jobs, Payload, Queue
from conveyor.errors import JobFailed
from conveyor.tasks.releasing import ASYNC_THREADS
from conveyor.tasks.worker import ProcessWorker
from tests.support.brokers import SERVER_BROKERS
from tests.support.harness import make_settings, running
from tests.support.waiting import wait_for

jobs = Jobs()
WIDE = Queue("aio_wide", concurrency=100, max_attempts=1, time_limit=60)
NARROW = Queue("aio_narrow", concurrency=10, max_attempts=3, min_backoff=0.05, max_backoff=0.1, time_limit=60)


class Load:
    """Coroutines of this process in flight, and the most at once (they all run on the one loop thread)."""

    def __init__(self) -> None:
        self.now = self.peak = self.done = 0
        self.log: dict[str, list[str]] = {}

    def enter(self) -> None:
        self.now += 1
        self.peak = max(self.peak, self.now)

    def leave(self) -> None:
        self.now -= 1
        self.done += 1


load = Load()


class Wait(Payload):
    token: str = ""
    sleep: float = 0
    fail_times: int = 0
    swallow: bool = False
    cooperative: bool = False


async def _wait(payload: Wait, ctx: JobContext) -> dict[str, object]:
    load.enter()
    try:
        await asyncio.sleep(payload.sleep)
    finally:
        load.leave()
    if ctx.attempt <= payload.fail_times:
        raise RuntimeError(f"{payload.token} fails on attempt {ctx.attempt}")
    return {"token": payload.token, "attempt": ctx.attempt}


wide = jobs.job("aio.wide", queue=WIDE, payload=Wait)(_wait)
narrow = jobs.job("aio.narrow", queue=NARROW, payload=Wait, store_result=True)(_wait)


@jobs.job("aio.limited", queue=NARROW, payload=Wait, time_limit=1, store_result=True)
async def limited(payload: Wait, ctx: JobContext) -> str:
    steps = load.log.setdefault(payload.token, [])
    try:
        await asyncio.sleep(payload.sleep)
    except asyncio.CancelledError:
        steps.append("cancelled")
        if not payload.swallow:
            raise
    return "returned"


@jobs.job("aio.cancellable", queue=NARROW, payload=Wait)
async def cancellable(payload: Wait, ctx: JobContext) -> None:
    steps = load.log.setdefault(payload.token, [])
    steps.append("started")
    try:
        while True:
            if ctx.cancelled:
                if "seen" not in steps:
                    steps.append("seen")
                if payload.cooperative:
                    return
            await asyncio.sleep(0.01)
    except asyncio.CancelledError:
        steps.append("interrupted")
        raise


@pytest.fixture(params=SERVER_BROKERS)
def app(request, clean_env, redis_url, database_url):
    global load
    load = Load()
    app = App(make_settings(request.param, redis_url, database_url, queues={}, cancel_grace_seconds=1.0), jobs=[jobs])
    yield app
    app.close()


def _completed(app: App, queue: str, n: int, timeout: float = 60) -> None:
    wait_for(lambda: app.broker.queue_counts(queue).completed_total >= n, timeout=timeout, message=f"{n} completed")


def test_a_queue_of_concurrency_100_runs_100_awaiting_jobs_on_a_few_threads(app):
    for i in range(200):
        wide.enqueue(Wait(token=f"w{i}", sleep=0.5))
    threads_before = threading.active_count()
    worker = ProcessWorker(app, "aio_wide")
    assert (worker.concurrency, worker.threads) == (100, ASYNC_THREADS)
    most_threads = 0
    worker.start()
    try:
        started = time.monotonic()
        while app.broker.queue_counts("aio_wide").completed_total < 200:
            most_threads = max(most_threads, threading.active_count())
            assert time.monotonic() - started < 60, "200 jobs did not complete"
            time.sleep(0.02)
        took = time.monotonic() - started
    finally:
        worker.stop()
    added = most_threads - threads_before
    print(
        f"\n[{app.settings.broker_name}] 200 x sleep(0.5) at concurrency 100: {took:.2f} s, peak {load.peak}, "
        f"{added} threads added"
    )
    # 200 x 0.5 s over 100 slots is 1 s; held threads (4 of them) would take 25 s.
    assert took < 5, took
    assert 50 <= load.peak <= 100, load.peak
    # Threads held per awaiting job would add 100; here: 4 worker threads, 4 finishers, the loop, the
    # consumers and the broker's and middleware's own (more on Postgres: its listener and pools).
    assert added <= 40, added
    assert load.done == 200


def test_the_concurrency_bounds_the_coroutines_in_flight(app):
    for i in range(40):
        narrow.enqueue(Wait(token=f"n{i}", sleep=0.3))
    with running(app, "aio_narrow"):
        _completed(app, "aio_narrow", 40)
    # The prefetch holds 20 here: a slot given back before the coroutine's end would let more run.
    assert load.peak == 10, load.peak


def test_a_failed_coroutine_is_retried_and_its_next_attempt_stored(app):
    with running(app, "aio_narrow"):
        ref = narrow.enqueue(Wait(token="flaky", fail_times=1))
        assert ref.result(timeout=60) == {"token": "flaky", "attempt": 2}


def test_a_coroutine_that_swallows_its_time_limit_still_fails_its_attempt(app):
    with running(app, "aio_narrow"):
        ref = limited.enqueue(Wait(token="swallow", sleep=60, swallow=True))
        started = time.monotonic()
        with pytest.raises(JobFailed, match="TimeLimitExceeded"):
            ref.result(timeout=60)
        took = time.monotonic() - started
    assert load.log["swallow"] == ["cancelled"] * 3, "each of its three attempts was cancelled at its limit"
    assert took < 15, took  # three attempts of one second each, with backoffs


def test_a_cancel_is_seen_by_a_cooperative_coroutine_and_interrupts_a_stubborn_one(app):
    with running(app, "aio_narrow"):
        polite = cancellable.enqueue(Wait(token="polite", cooperative=True))
        stubborn = cancellable.enqueue(Wait(token="stubborn"))
        wait_for(lambda: "polite" in load.log and "stubborn" in load.log, timeout=30, message="both to start")
        asked = time.monotonic()
        app.jobs.cancel(polite.id)
        app.jobs.cancel(stubborn.id)
        for ref in (polite, stubborn):
            wait_for(
                lambda ref=ref: (r := app.broker.get_job(ref.id)) and r.state == "cancelled",
                timeout=30,
                message="cancelled",
            )
        took = time.monotonic() - asked
    assert load.log["polite"] == ["started", "seen"]
    assert load.log["stubborn"] == ["started", "seen", "interrupted"]
    assert took < 5, took  # the grace is one second


def test_a_drain_lets_the_coroutines_in_flight_finish_and_acks_them(app):
    worker = ProcessWorker(app, "aio_wide")
    worker.start()
    try:
        for i in range(20):
            wide.enqueue(Wait(token=f"d{i}", sleep=1.5))
        wait_for(lambda: load.now == 20, timeout=30, message="20 coroutines in flight")
    finally:
        stopping = time.monotonic()
        worker.stop()
    assert time.monotonic() - stopping > 0.5, "the stop waited for the coroutines"
    assert load.done == 20
    counts = app.broker.queue_counts("aio_wide")
    assert (counts.completed_total, counts.active, counts.waiting) == (20, 0, 0)
