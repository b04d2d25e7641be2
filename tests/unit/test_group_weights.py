"""Group weights (issue 21.2) where they enter: Queue(group_weights=), the queue's settings, app.jobs, the
admin API's error table, the CLI. No servers: the inline broker keeps and reports weights (it serves no
group apart); the brokers' turns are the contract suite's (tests/contract/test_groups.py)."""

from __future__ import annotations

import pytest

from conveyor import App, JobContext, Jobs, Payload, Queue
from conveyor.api.errors import detail_for, status_for
from conveyor.errors import InvalidGroupWeight, UnknownQueue
from conveyor.settings import Settings


class Ping(Payload):
    n: int = 0


def app_with(queue: Queue, **values) -> App:
    jobs = Jobs()

    @jobs.job("weights.ping", queue=queue, payload=Ping)
    def ping(payload: Ping, ctx: JobContext) -> None:
        return None

    settings = Settings(**{"broker": "inline", "database_url": "postgresql://unused/db", "platform": False, **values})
    return App(settings, jobs=[jobs])


def test_a_queues_weights_are_a_value_checked_when_declared():
    q = Queue("tenants", group_weights={"vip": 3, "gold": 2})
    assert q.group_weights == (("gold", 2), ("vip", 3))
    assert q == Queue("tenants", group_weights={"gold": 2, "vip": 3}) and hash(q)
    for bad in ({"vip": 0}, {"vip": 1001}, {"": 2}, {"vip": 2.5}, {"x" * 129: 2}, {"vip": True}):
        with pytest.raises(ValueError, match="group_weights"):
            Queue("tenants", group_weights=bad)


def test_the_environment_sets_a_queues_weights_and_they_reach_the_broker(monkeypatch):
    monkeypatch.setenv("CONVEYOR_QUEUES__TENANTS__GROUP_WEIGHTS", '{"vip": 5}')
    app = app_with(Queue("tenants", group_weights={"gold": 2}))
    try:
        assert app.queues["tenants"].group_weights == (("vip", 5),), "the setting replaces the code's map"
        assert app.broker.group_weights == {"tenants": {"vip": 5}}
        assert app.jobs.group_weights("tenants") == {"vip": 5}
    finally:
        app.close()


@pytest.mark.parametrize("value", ['{"vip": 0}', '{"vip": 1001}', '{"vip": "x"}'])
def test_a_bad_weight_in_the_environment_is_refused_at_start(monkeypatch, value):
    monkeypatch.setenv("CONVEYOR_QUEUES__TENANTS__GROUP_WEIGHTS", value)
    with pytest.raises(ValueError):
        app_with(Queue("tenants")).queues


def test_app_jobs_sets_and_reads_weights_and_refuses_bad_ones():
    app = app_with(Queue("tenants", group_weights={"gold": 2}))
    try:
        app.jobs.set_group_weight("tenants", "user:42", 3)
        assert app.jobs.group_weights("tenants") == {"gold": 2, "user:42": 3}
        app.jobs.set_group_weight("tenants", "user:42", 1)
        assert app.jobs.group_weights("tenants") == {"gold": 2}
        for group, weight in (("vip", 0), ("vip", 1001), ("", 2), ("vip", 2.0), ("bad\nname", 2)):
            with pytest.raises(InvalidGroupWeight):
                app.jobs.set_group_weight("tenants", group, weight)  # type: ignore[arg-type]
        with pytest.raises(InvalidGroupWeight, match="settings"):
            app.jobs.set_group_weight("tenants", "gold", 5)  # the queue's settings give gold's weight
        with pytest.raises(UnknownQueue):
            app.jobs.set_group_weight("nope", "vip", 2)
        with pytest.raises(UnknownQueue):
            app.jobs.group_weights("nope")
    finally:
        app.close()


def test_a_bad_weight_is_a_422_that_does_not_echo_the_group():
    app = app_with(Queue("tenants"))
    try:
        with pytest.raises(InvalidGroupWeight) as caught:
            app.jobs.set_group_weight("tenants", "secret-tenant\x00", 2)
    finally:
        app.close()
    assert status_for(caught.value) == 422
    assert "secret-tenant" not in detail_for(caught.value)
