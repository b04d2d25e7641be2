"""Async jobs (issue 21.7), on every broker: an ``async def`` processor runs on the App's event loop,
gets its ctx, has its result stored, and a time limit cancels it at its ``await``."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from conveyor import App, JobContext, Jobs, Payload, Queue
from conveyor.errors import JobFailed
from tests.support.brokers import ALL_BROKERS
from tests.support.harness import make_settings, running

jobs = Jobs()
AIO = Queue("aio", concurrency=8, max_attempts=1, min_backoff=0.05, max_backoff=0.1, time_limit=30)

#: What the coroutines saw, by token: the thread they ran on, and whether they were cancelled.
seen: dict[str, dict[str, object]] = {}


class Nap(Payload):
    token: str
    sleep: float = 0


@jobs.job("aio.nap", queue=AIO, payload=Nap, store_result=True)
async def nap(payload: Nap, ctx: JobContext) -> dict[str, object]:
    seen[payload.token] = {"thread": threading.get_ident(), "cancelled": False}
    try:
        await asyncio.sleep(payload.sleep)
    except asyncio.CancelledError:
        seen[payload.token]["cancelled"] = True
        raise
    return {"token": payload.token, "job_id": ctx.job_id, "attempt": ctx.attempt, "queue": ctx.queue}


@jobs.job("aio.stuck", queue=AIO, payload=Nap, time_limit=1, store_result=True)
async def stuck(payload: Nap, ctx: JobContext) -> None:
    await nap(payload, ctx)


@pytest.fixture(params=ALL_BROKERS)
def app(request, clean_env, redis_url, database_url):
    app = App(make_settings(request.param, redis_url, database_url, queues={}), jobs=[jobs])
    yield app
    app.close()


def test_an_async_job_runs_with_its_ctx_and_its_result_is_stored(app):
    with running(app, "aio"):
        ref = nap.enqueue(Nap(token="a1"))
        assert ref.result(timeout=60) == {"token": "a1", "job_id": ref.id, "attempt": 1, "queue": "aio"}
    assert seen["a1"]["thread"] != threading.get_ident()


def test_a_time_limit_cancels_a_sleeping_coroutine(app):
    with running(app, "aio"):
        ref = stuck.enqueue(Nap(token="stuck", sleep=60))
        started = time.monotonic()
        with pytest.raises(JobFailed, match="TimeLimitExceeded"):
            ref.result(timeout=60)
        assert time.monotonic() - started < 30
    assert seen["stuck"]["cancelled"] is True


def test_the_coroutines_of_a_process_share_one_loop_and_await_side_by_side(app):
    tokens = [f"many{i}" for i in range(8)]
    with running(app, "aio"):
        started = time.monotonic()
        refs = [nap.enqueue(Nap(token=t, sleep=1.0)) for t in tokens]
        assert [r.result(timeout=60)["token"] for r in refs] == tokens
        took = time.monotonic() - started
    assert len({seen[t]["thread"] for t in tokens}) == 1
    # Eight one-second naps on one loop thread: side by side, not one after another.
    assert took < 6, took
