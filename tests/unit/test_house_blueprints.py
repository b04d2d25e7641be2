"""Blueprints (issue 19.1): the registry is an object, so two Apps in one process see disjoint jobs,
a handle enqueues on its App, and a user's Dramatiq middleware runs. No servers: the inline broker."""

from __future__ import annotations

import threading

import pytest
from dramatiq import Middleware

from conveyor import App, JobContext, JobHandle, Jobs, Payload, Queue
from conveyor.errors import ConfigurationError, InvalidPayload
from conveyor.settings import Settings
from conveyor.tasks.worker import InlineWorkers
from tests.support.waiting import wait_for


class Add(Payload):
    a: int
    b: int


def inline(**values) -> Settings:
    return Settings(**{"broker": "inline", "database_url": "postgresql://unused/db", "platform": False, **values})


def with_handle(job: str, queue: str, seen: list[int]) -> tuple[Jobs, JobHandle[Add, int]]:
    jobs = Jobs()

    @jobs.job(job, queue=Queue(queue, min_backoff=0.01, max_backoff=0.01), payload=Add)
    def add(payload: Add, ctx: JobContext) -> int:
        seen.append(payload.a + payload.b)
        return payload.a + payload.b

    return jobs, add


def blueprint(job: str, queue: str, seen: list[int]) -> Jobs:
    return with_handle(job, queue, seen)[0]


def test_two_apps_in_one_process_see_disjoint_jobs():
    first, second = blueprint("math.add", "math", []), blueprint("text.add", "text", [])
    one, two = App(inline(), jobs=[first]), App(inline(), jobs=[second])
    try:
        assert list(one.job_types) == ["math.add"] and list(one.queues) == ["math"]
        assert list(two.job_types) == ["text.add"] and list(two.queues) == ["text"]
        with pytest.raises(Exception, match="unknown job 'text.add'"):
            one.jobs.enqueue("text.add", {"a": 1, "b": 2})
    finally:
        one.close()
        two.close()


def test_a_handle_enqueues_on_its_app_checked_against_the_payload_and_is_still_the_function():
    seen: list[int] = []
    jobs, h = with_handle("math.add", "math", seen)
    assert h(Add(a=2, b=3), None) == 5  # callable as the function, in a test
    app = App(inline(), jobs=[jobs])
    workers = InlineWorkers(app).start()
    try:
        with pytest.raises(InvalidPayload):
            h.enqueue({"a": "not a number", "b": 1})
        ref = h.enqueue(Add(a=20, b=22), key="k1")
        assert h.enqueue({"a": 1, "b": 1}, key="k1").id == ref.id  # the key makes the second a no-op
        # Worker.join returns before a consumer has fetched a message: wait on the outcome.
        wait_for(lambda: app.broker.get_job(ref.id).state == "completed", message="the job to complete")
        assert seen == [5, 42]
    finally:
        workers.stop()
        app.close()


def test_a_handle_of_a_blueprint_no_app_includes_says_so():
    jobs = Jobs()

    @jobs.job("lonely", queue=Queue("lonely"), payload=Add)
    def lonely(payload: Add, ctx: JobContext) -> None: ...

    with pytest.raises(ConfigurationError, match="belongs to no App"):
        lonely.enqueue({"a": 1, "b": 2})


def test_one_job_name_in_two_blueprints_or_a_queue_nobody_declares_fails_at_start():
    with pytest.raises(ConfigurationError, match="defined by two blueprints"):
        App(inline(), jobs=[blueprint("x", "q", []), blueprint("x", "q", [])])
    jobs = Jobs()
    jobs.job("y", queue="nowhere", payload=Add)(lambda p, ctx: None)
    with pytest.raises(ConfigurationError, match="no blueprint declares"):
        App(inline(), jobs=[jobs])
    different = Jobs()
    different.job("z", queue=Queue("q", concurrency=9), payload=Add)(lambda p, ctx: None)
    with pytest.raises(ConfigurationError, match="declared twice"):
        App(inline(), jobs=[blueprint("x", "q", []), different])


class Counts(Middleware):
    def __init__(self) -> None:
        self.done: list[str] = []
        self.lock = threading.Lock()

    def after_process_message(self, broker, message, *, result=None, exception=None) -> None:
        with self.lock:
            self.done.append(message.actor_name)


def test_a_users_dramatiq_middleware_runs_after_conveyors():
    counts = Counts()
    app = App(inline(), jobs=[blueprint("math.add", "math", [])], middleware=[counts])
    assert app.broker.middleware[-1] is counts
    workers = InlineWorkers(app).start()
    try:
        app.jobs.enqueue("math.add", {"a": 1, "b": 2})
        wait_for(lambda: counts.done == ["math.add"], message="the user's middleware to see the job")
    finally:
        workers.stop()
        app.close()


def test_the_platform_is_a_blueprint_an_app_includes_by_choice():
    from conveyor.platform.jobs import jobs as platform

    app = App(inline(platform=True))
    try:
        assert platform in app.blueprints and "credit.consume" in app.job_types
    finally:
        app.close()
    alone = App(inline(), jobs=[blueprint("math.add", "math", [])])
    assert "credit.consume" not in alone.job_types and "agent" not in alone.queues
    alone.close()


def test_a_blueprints_middleware_is_built_for_each_app_that_includes_it():
    jobs = blueprint("math.add", "math", [])
    jobs.add_middleware(Counts)
    one, two = App(inline(), jobs=[jobs]), App(inline(), jobs=[jobs])
    try:
        first, second = one.broker.middleware[-1], two.broker.middleware[-1]
        assert isinstance(first, Counts) and isinstance(second, Counts) and first is not second
        workers = InlineWorkers(one).start()
        try:
            one.jobs.enqueue("math.add", {"a": 1, "b": 2})
            wait_for(lambda: first.done == ["math.add"], message="the first App's middleware to see the job")
        finally:
            workers.stop()
        assert second.done == []
    finally:
        one.close()
        two.close()
