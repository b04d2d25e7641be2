"""Operator actions on every broker through the ConveyorBroker interface: retry, retry all, delete, oldest age."""

from __future__ import annotations

import time

import pytest

from conveyor.app import App
from conveyor.middleware.base import ConveyorMiddleware
from tests.support.brokers import ALL_BROKERS
from tests.support.obs_support import broker_app as make_app
from tests.support.obs_support import running as run_workers
from tests.support.waiting import wait_for

QUEUE = "indexing"

#: Every broker this suite runs on.


@pytest.fixture(params=ALL_BROKERS)
def broker_app(request):
    app = make_app(request, request.param)
    yield app
    app.close()


def running(app: App):
    """Workers for the queue; a redis worker has its own App, as a worker process would."""
    return run_workers(app, QUEUE, own_app=True)


def counts(app):
    return app.broker.queue_counts(QUEUE)


def test_retry_job_runs_a_failed_job_again_with_a_fresh_budget(broker_app, tmp_path):
    marker = tmp_path / "fail"
    marker.touch()
    with running(broker_app):
        ref = broker_app.jobs.enqueue("obs.work", {"n": 1, "fail_while": str(marker)})
        wait_for(lambda: counts(broker_app).failed == 1, message="the job to fail for good")
        record = broker_app.broker.get_job(ref.id)
        assert (record.state, record.attempts) == ("failed", 3)
        marker.unlink()
        assert broker_app.broker.retry_job(ref.id) is True
        wait_for(lambda: broker_app.broker.get_job(ref.id).state == "completed", message="the retried job to complete")
    record = broker_app.broker.get_job(ref.id)
    assert record.attempts == 1  # a fresh budget: the earlier three do not count against it
    c = counts(broker_app)
    assert (c.failed, c.completed_total, c.failed_total) == (0, 1, 1)


def test_retry_job_refuses_jobs_that_have_not_failed(broker_app):
    broker_app.broker.pause_queue(QUEUE)
    ref = broker_app.jobs.enqueue("obs.work", {"n": 1})
    assert broker_app.broker.retry_job(ref.id) is False
    assert broker_app.broker.retry_job("no-such-job") is False
    assert broker_app.broker.get_job(ref.id).state == "waiting"


def test_retry_failed_retries_every_failed_job_of_the_queue(broker_app, tmp_path):
    marker = tmp_path / "fail"
    marker.touch()
    with running(broker_app):
        refs = [broker_app.jobs.enqueue("obs.work", {"n": n, "fail_while": str(marker)}) for n in range(4)]
        wait_for(lambda: counts(broker_app).failed == 4, message="four failed jobs")
        marker.unlink()
        assert broker_app.broker.retry_failed(QUEUE) == 4
        wait_for(lambda: counts(broker_app).completed_total == 4, message="the four retried jobs to complete")
    assert {broker_app.broker.get_job(r.id).state for r in refs} == {"completed"}
    assert broker_app.broker.retry_failed(QUEUE) == 0


def test_a_retried_job_that_fails_again_runs_its_final_failure_hooks_again(broker_app):
    dead = []

    class Recorder(ConveyorMiddleware):
        def after_job_dead(self, broker, message, error):
            dead.append(message.message_id)

    broker_app.broker.middleware.append(Recorder())
    with run_workers(broker_app, QUEUE):  # the worker shares this App, and so the recorder
        ref = broker_app.jobs.enqueue("obs.work", {"n": 1, "fail": True})
        wait_for(lambda: dead == [ref.id], message="the first final failure")
        broker_app.broker.retry_job(ref.id)
        wait_for(lambda: dead == [ref.id, ref.id], message="the second final failure")


def test_delete_job_removes_waiting_delayed_and_failed_jobs_and_they_never_run(broker_app, tmp_path):
    broker_app.broker.pause_queue(QUEUE)
    waiting = broker_app.jobs.enqueue("obs.work", {"n": 1}, key="delete-me")
    delayed = broker_app.jobs.enqueue("obs.work", {"n": 2}, delay=0.5)
    assert broker_app.broker.get_job(delayed.id).state == "delayed"
    assert broker_app.broker.delete_job(waiting.id) is True
    assert broker_app.broker.delete_job(delayed.id) is True
    assert broker_app.broker.get_job(waiting.id) is None
    assert broker_app.broker.get_job(delayed.id) is None
    assert broker_app.broker.delete_job(waiting.id) is False
    # The key is free again: the same key enqueues a new job.
    again = broker_app.jobs.enqueue("obs.work", {"n": 1}, key="delete-me")
    assert again.id != waiting.id and not again.deduplicated
    broker_app.broker.resume_queue(QUEUE)
    with running(broker_app):
        # Due after the deleted delayed job: once it ran, the deleted one's delay was over too.
        sentinel = broker_app.jobs.enqueue("obs.work", {"n": 3}, delay=0.6)
        wait_for(lambda: broker_app.broker.get_job(sentinel.id).state == "completed", message="the sentinel")
        wait_for(lambda: counts(broker_app).completed_total == 2, message="the new job to complete")
    assert broker_app.broker.get_job(delayed.id) is None
    assert counts(broker_app).completed_total == 2
    c = counts(broker_app)
    assert (c.waiting, c.delayed, c.failed) == (0, 0, 0)


def test_delete_job_refuses_a_running_job(broker_app):
    with running(broker_app):
        ref = broker_app.jobs.enqueue("obs.work", {"n": 1, "sleep": 1.5})
        wait_for(lambda: broker_app.broker.get_job(ref.id).state == "active", message="the job to start")
        assert broker_app.broker.delete_job(ref.id) is False
        wait_for(lambda: broker_app.broker.get_job(ref.id).state == "completed", message="the job to complete")
    assert broker_app.broker.delete_job(ref.id) is True


def test_queue_counts_give_the_oldest_waiting_job(broker_app):
    broker_app.broker.pause_queue(QUEUE)
    assert counts(broker_app).oldest_waiting_at is None
    before = time.time()
    broker_app.jobs.enqueue("obs.work", {"n": 1})
    broker_app.jobs.enqueue("obs.work", {"n": 2})
    oldest = counts(broker_app).oldest_waiting_at
    assert before - 1 <= oldest <= time.time()
