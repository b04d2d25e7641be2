"""Job handles and results (issue 19.3), on every broker: a handle enqueues checked against its
payload model, ``app.jobs.get`` reads a job's state, and ``result()`` waits for a stored return
value on the store's wake-up, raising the job's error once it failed for good."""

from __future__ import annotations

import threading
import time

import pytest

from conveyor import App, JobContext, Jobs, Payload, PermanentError, Queue
from conveyor.errors import InvalidPayload, JobFailed, ResultNotStored, ResultTimeout
from conveyor.results import Entry, results_store
from tests.support.brokers import ALL_BROKERS
from tests.support.harness import make_settings, running
from tests.support.waiting import wait_for

jobs = Jobs()
MATH = Queue("math", concurrency=2, max_attempts=2, min_backoff=0.05, max_backoff=0.1, time_limit=30)


class Add(Payload):
    a: int
    b: int
    sleep: float = 0
    fail: str = ""


@jobs.job("math.add", queue=MATH, payload=Add, store_result=True)
def add(payload: Add, ctx: JobContext) -> dict[str, int]:
    time.sleep(payload.sleep)
    if payload.fail == "permanent":
        raise PermanentError(f"cannot add {payload.a} and {payload.b}")
    if payload.fail == "always":
        raise RuntimeError(f"attempt {ctx.attempt} fails")
    if payload.fail == "not json":
        return {"set": {1, 2}}  # type: ignore[dict-item]
    return {"sum": payload.a + payload.b}


@jobs.job("math.forget", queue=MATH, payload=Add)
def forget(payload: Add, ctx: JobContext) -> int:
    return payload.a


@pytest.fixture(params=ALL_BROKERS)
def app(request, clean_env, redis_url, database_url):
    app = App(make_settings(request.param, redis_url, database_url, queues={}), jobs=[jobs])
    yield app
    app.close()


def test_a_handle_enqueues_and_its_ref_waits_for_the_result(app):
    with running(app, "math"):
        ref = add.enqueue(Add(a=20, b=22))
        assert ref.result(timeout=60) == {"sum": 42}
        assert add.result(ref.id, timeout=1) == {"sum": 42}  # stored: read again at once
        # Stored before the ack: the record says completed a moment later.
        view = wait_for(lambda: (v := app.jobs.get(ref.id)).state == "completed" and v, timeout=30)
    assert (view.job, view.state, view.attempts) == ("math.add", "completed", 1)
    assert view.enqueued_at and view.finished_at and view.finished_at >= view.enqueued_at


def test_a_waiter_armed_before_the_job_runs_is_woken_by_its_result(app):
    with running(app, "math"):
        ref = add.enqueue({"a": 1, "b": 2, "sleep": 1.0})
        got: list[object] = []
        waiter = threading.Thread(target=lambda: got.append(ref.result(timeout=120)))
        waiter.start()
        record = wait_for(lambda: (r := app.broker.get_job(ref.id)) and r.state == "completed" and r, timeout=60)
        # Stored before the ack: the waiter is woken by then (a wait slice that only timed out
        # would leave it asleep for seconds more; its timeout is 120 s).
        waiter.join(timeout=5)
        assert not waiter.is_alive(), "the waiter missed its wake-up"
    assert got == [{"sum": 3}] and record.finished_at


def test_a_job_that_failed_for_good_raises_its_error(app):
    with running(app, "math"):
        ref = add.enqueue({"a": 1, "b": 2, "fail": "permanent"})
        raised: list[JobFailed] = []
        waiter = threading.Thread(target=lambda: raised.extend(_failure(ref)))
        waiter.start()
        wait_for(lambda: (r := app.broker.get_job(ref.id)) and r.state == "failed", timeout=60)
        waiter.join(timeout=5)  # woken by the failure marker, not at its 120 s timeout
        assert not waiter.is_alive(), "the waiter missed the failure's wake-up"
        assert raised[0].job == "math.add" and "cannot add 1 and 2" in raised[0].error
        retried = add.enqueue({"a": 1, "b": 2, "fail": "always"})
        with pytest.raises(JobFailed, match="attempt 2 fails"):
            retried.result(timeout=120)
        view = app.jobs.get(retried.id)
    assert view.state == "failed" and view.attempts == 2 and "attempt 2 fails" in (view.error or "")


def _failure(ref) -> list[JobFailed]:
    try:
        ref.result(timeout=120)
    except JobFailed as exc:
        return [exc]
    return []


def test_a_value_that_is_not_json_fails_the_job_saying_so(app):
    with running(app, "math"):
        ref = add.enqueue({"a": 1, "b": 2, "fail": "not json"})
        with pytest.raises(JobFailed, match="not JSON"):
            ref.result(timeout=120)


def test_no_result_yet_is_a_timeout_and_a_job_that_keeps_none_says_so(app):
    ref = add.enqueue({"a": 1, "b": 2})  # no worker runs it
    with pytest.raises(ResultTimeout, match="waiting"):
        ref.result(timeout=0.3)
    with pytest.raises(ResultNotStored):
        forget.result(forget.enqueue({"a": 1, "b": 2}), timeout=0.3)
    with pytest.raises(InvalidPayload):
        add.enqueue({"a": "one", "b": 2})


def test_a_handle_takes_a_key_and_a_delay(app):
    later = add.enqueue({"a": 1, "b": 2}, key="sum:later", delay=3600)  # no worker needed: it waits an hour
    assert app.jobs.get(later.id).state == "delayed"
    again = add.enqueue({"a": 1, "b": 2}, key="sum:later")
    assert (again.id, again.deduplicated) == (later.id, True), "a second enqueue with the key is a no-op"


@pytest.mark.parametrize("broker", ALL_BROKERS)
def test_a_result_is_kept_for_the_result_ttl_then_gone(broker, clean_env, redis_url, database_url):
    """CONVEYOR_RESULT_TTL reaches every store: the result is read at once, then expires while the
    job's record (kept for CONVEYOR_RETENTION) still says completed."""
    app = App(make_settings(broker, redis_url, database_url, queues={}, result_ttl=1.0), jobs=[jobs])
    try:
        with running(app, "math"):
            ref = add.enqueue({"a": 3, "b": 4})
            assert ref.result(timeout=60) == {"sum": 7}

        def gone() -> bool:
            try:
                ref.result(timeout=0)
            except ResultTimeout as exc:
                assert "it is completed" in str(exc)
                return True
            return False

        wait_for(gone, timeout=30, message="the result to expire after its 1 s TTL")
        assert app.jobs.get(ref.id).state == "completed"
    finally:
        app.close()


def test_the_first_result_stored_stays(app):
    store = results_store(app)
    ref = add.enqueue({"a": 1, "b": 2})
    store.put(ref.id, "math.add", Entry(False), 60)
    store.put(ref.id, "math.add", Entry(True, '{"sum": 3}'), 60)  # a result replaces a failure marker
    store.put(ref.id, "math.add", Entry(True, '{"sum": 99}'), 60)  # a repeat run's value is dropped
    store.put(ref.id, "math.add", Entry(False), 60)
    assert add.result(ref, timeout=1) == {"sum": 3}
