"""The Redis broker's fast paths (from the benchmarks): one index per job record.

Waking an idle consumer is every broker's, in tests/contract/test_wakeup.py; event lines,
encoded once, are tested in tests/unit/test_event_lines.py.
"""

from __future__ import annotations

import pytest
import redis

from conveyor.app import App
from tests.support.harness import make_settings, running
from tests.support.waiting import wait_for

STATES = ("waiting", "delayed", "active", "completed", "failed")


@pytest.fixture
def app(clean_env, redis_url, database_url):
    app = App(make_settings("redis", redis_url, database_url))
    yield app
    app.close()


def test_job_record_sits_in_exactly_one_state_index_through_retry_and_delay(app, redis_url):
    client = redis.Redis.from_url(redis_url)
    ns = app.settings.redis_namespace

    def indexes(job_id: str) -> list[str]:
        return [s for s in STATES if client.zscore(f"{ns}:idx:critical:{s}", job_id) is not None]

    try:
        later = app.jobs.enqueue("test.probe.critical", {"token": "later"}, delay=3600)
        assert indexes(later.id) == ["delayed"]
        with running(app, "critical"):
            flaky = app.jobs.enqueue("test.probe.critical", {"token": "flaky", "fail_times": 1})
            wait_for(lambda: app.broker.get_job(flaky.id).state == "completed", message="the retried job to finish")
        assert app.broker.get_job(flaky.id).attempts == 2
        assert indexes(flaky.id) == ["completed"]
        assert indexes(later.id) == ["delayed"]
        counts = app.broker.queue_counts("critical")
        assert (counts.waiting, counts.delayed, counts.active, counts.failed) == (0, 1, 0, 0)
    finally:
        client.close()


def test_a_flush_empties_the_groups_ready_sets_and_their_ring(app, redis_url):
    app.jobs.enqueue_many([{"job": "test.grouped", "payload": {"grp": g}, "group": g} for g in ("a", "b", "a")])
    client = redis.Redis.from_url(redis_url)
    keys = app.broker.keys.scope("indexing")
    assert client.llen(keys.groups("indexing")) == 3  # a, b and the default group's turn
    app.broker.flush("indexing")
    assert not client.exists(
        keys.groups("indexing"),
        keys.group_stamp("indexing"),
        *(keys.group_ready("indexing", g) for g in ("a", "b")),
    )
