"""Cron for any job, in the library (issue 19.4): schedules declared on a blueprint fire on every
broker with the platform absent, each occurrence once however many schedulers pass."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from conveyor import App, JobContext, Jobs, Payload, Queue
from conveyor.errors import ConfigurationError
from conveyor.scheduling.firing import CronFirer, fire_key, server_now
from tests.support.brokers import ALL_BROKERS
from tests.support.harness import make_settings, running

jobs = Jobs()
seen: list[tuple[str, str]] = []


class Ping(Payload):
    who: str


@jobs.job("cron.ping", queue=Queue("cron"), payload=Ping, store_result=True)
def ping(payload: Ping, ctx: JobContext) -> str:
    seen.append((ctx.job_id, payload.who))
    return payload.who


EVERY_FIVE = jobs.schedule("*/5 * * * *", ping, Ping(who="five"))
BERLIN_NINE = jobs.schedule("0 9 * * *", "cron.ping", {"who": "nine"}, tz="Europe/Berlin", name="berlin-nine")


@pytest.fixture(params=ALL_BROKERS)
def app(request, clean_env, redis_url, database_url):
    seen.clear()
    app = App(make_settings(request.param, redis_url, database_url, queues={}, platform=False), jobs=[jobs])
    yield app
    app.close()


def test_an_occurrence_fires_once_however_many_schedulers_pass(app):
    at = datetime(2026, 3, 2, 10, 5, 20, tzinfo=UTC)  # 20 s after a */5 occurrence
    first, second = CronFirer(app), CronFirer(app)  # two schedulers
    fired = first.tick(at)
    assert [(f.schedule, f.fire_time, f.deduplicated) for f in fired] == [
        (EVERY_FIVE.name, datetime(2026, 3, 2, 10, 5, tzinfo=UTC), False)
    ]
    again = second.tick(at + timedelta(seconds=5))
    assert [(f.job_id, f.deduplicated) for f in again] == [(fired[0].job_id, True)]
    assert first.tick(at + timedelta(seconds=10)) == []  # sent already: not sent again in its window
    with running(app, "cron"):
        assert ping.result(fired[0].job_id, timeout=60) == "five"
    assert seen == [(fired[0].job_id, "five")]


def test_an_occurrence_missed_past_the_grace_is_skipped_and_the_zone_is_the_schedules(app):
    grace = app.settings.scheduler_misfire_grace
    assert CronFirer(app).tick(datetime(2026, 3, 2, 10, 5, tzinfo=UTC) + timedelta(seconds=grace + 1)) == []
    # 09:00 in Berlin is 08:00 UTC in winter.
    assert [f.schedule for f in CronFirer(app).tick(datetime(2026, 3, 2, 9, 0, 10, tzinfo=UTC))] == [EVERY_FIVE.name]
    fired = [
        f for f in CronFirer(app).tick(datetime(2026, 3, 2, 8, 0, 10, tzinfo=UTC)) if f.schedule != EVERY_FIVE.name
    ]
    assert [(f.schedule, f.fire_time) for f in fired] == [("berlin-nine", datetime(2026, 3, 2, 8, 0, tzinfo=UTC))]
    assert app.jobs.get(fired[0].job_id).key == fire_key("berlin-nine", fired[0].fire_time)


def test_time_is_the_servers(app):
    assert abs((server_now(app) - datetime.now(UTC)).total_seconds()) < 30


def test_a_schedule_that_cannot_fire_fails_when_the_app_is_built(clean_env):
    settings = make_settings("inline", None, "postgresql://unused/db", queues={}, platform=False)
    bad = Jobs()
    bad.job("x", queue=Queue("x"), payload=Ping)(lambda p, ctx: None)
    bad.schedule("* * * * *", "x", {"who": 3})  # not a str
    with pytest.raises(ConfigurationError, match="schedule 'x@"):
        App(settings, jobs=[bad])
    orphan = Jobs()
    orphan.schedule("* * * * *", "nobody", {})
    with pytest.raises(ConfigurationError, match="no blueprint defines"):
        App(settings, jobs=[orphan])
    with pytest.raises(ValueError, match="cron"):
        Jobs().schedule("61 * * * *", "x", {})
    with pytest.raises(ConfigurationError, match="DEDUP_TTL"):
        CronFirer(App(settings.model_copy(update={"scheduler_misfire_grace": 10, "dedup_ttl": 5}), jobs=[jobs]))
