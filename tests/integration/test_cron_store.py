"""Managed cron schedules (issue 19): the store contract on every broker's store (memory, Postgres
directly and through a transaction-mode PgBouncer, Redis and Redis Cluster), what ``app.cron``
refuses, and how ``CronFirer`` fires stored schedules beside code ones."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from conveyor import App, JobContext, Jobs, Payload, Queue
from conveyor.errors import InvalidSchedule, ScheduleNotFound
from conveyor.scheduling.firing import CronFirer, fire_key, server_now
from conveyor.scheduling.store import StoredSchedule, schedule_store
from conveyor.settings import Settings
from tests.support.brokers import ALL_BROKERS

jobs = Jobs()


class Ping(Payload):
    who: str


@jobs.job("cron.ping", queue=Queue("pings"), payload=Ping)
def ping(payload: Ping, ctx: JobContext) -> None:
    pass


class Login(Payload):
    secret_fields = frozenset({"password"})
    password: str


@jobs.job("cron.login", queue=Queue("pings"), payload=Login)
def login(payload: Login, ctx: JobContext) -> None:
    pass


CODE = jobs.schedule("0 3 * * *", ping, Ping(who="code"), name="code-nightly")


@pytest.fixture(params=[*ALL_BROKERS, "postgres+pgbouncer", "redis-cluster"])
def app(request, redis_url, database_url):
    if request.param == "redis-cluster":  # redis+cluster://: the hash under the shared namespace's slot
        settings = Settings(
            broker="redis", redis_url=request.getfixturevalue("redis_cluster_url"), database_url=database_url
        )
    elif request.param == "postgres+pgbouncer":  # one statement each: nothing held across the pooler
        through = request.getfixturevalue("pgbouncer").url(database_url.rsplit("/", 1)[1])
        settings = Settings(
            broker="postgres", database_url=through, database_pooled=True, listen_database_url=database_url
        )
    else:
        settings = Settings(broker=request.param, redis_url=redis_url, database_url=database_url)
    app = App(settings.model_copy(update={"platform": False, "queues": {}}), jobs=[jobs])
    yield app
    app.close()


def stored(name: str, cron: str = "* * * * *", paused: bool = False, **payload: str) -> StoredSchedule:
    since = datetime(2026, 1, 1, tzinfo=UTC)
    return StoredSchedule(name, cron, "cron.ping", payload or {"who": name}, "Europe/Berlin", paused, since)


def test_the_store_puts_replaces_lists_pauses_and_deletes(app):
    store = schedule_store(app)
    assert store.list() == [] and store.get("a") is None
    store.put(stored("b"))
    store.put(stored("a"))
    assert [s.name for s in store.list()] == ["a", "b"]
    assert store.get("a") == stored("a")  # every field back as it went in, the zone-aware time too

    store.put(stored("a", cron="*/5 * * * *", who="replaced"))
    assert store.get("a") == stored("a", cron="*/5 * * * *", who="replaced")
    assert len(store.list()) == 2

    later = datetime(2026, 6, 1, 12, tzinfo=UTC)
    assert store.set_paused("a", True) is True
    assert store.get("a").paused and store.get("a").since == stored("a").since  # a pause keeps since
    assert store.set_paused("a", False, later) is True
    held = store.get("a")
    assert not held.paused and held.since == later and held.cron == "*/5 * * * *"
    assert store.set_paused("nope", True) is False

    assert store.delete("a") is True and store.delete("a") is False
    assert [s.name for s in store.list()] == ["b"]


def test_add_checks_everything_first_and_echoes_nothing(app):
    secret = "s3cr3t-value"
    cases = [
        ({"name": f"Bad {secret}"}, "name:"),
        ({"name": "code-nightly"}, "declared in code"),
        ({"cron": f"61 {secret}"}, "cron:"),
        ({"cron": "0 0 30 2 *"}, "cron:"),  # never fires
        ({"tz": f"Mars/{secret}"}, "timezone:"),
        ({"job": f"no.{secret}"}, "job:"),
        ({"job": "cron.login", "payload": {"password": secret}}, "secret fields"),
        ({"payload": {"who": 3}}, "payload:"),
        ({"payload": {"who": "x", secret: secret}}, "payload:"),
        ({"payload": {"who": secret * 100_000}}, "CONVEYOR_MAX_PAYLOAD_BYTES"),
    ]
    for change, where in cases:
        args = {"name": "nightly", "cron": "0 3 * * *", "job": "cron.ping", "payload": {"who": "x"}, **change}
        with pytest.raises(InvalidSchedule, match=where) as caught:
            app.cron.add(args.pop("name"), **args)
        assert secret not in str(caught.value).replace(f"{secret}: Extra", ""), where
    assert schedule_store(app).list() == []

    with pytest.raises(ScheduleNotFound):
        app.cron.pause("nightly")
    with pytest.raises(ScheduleNotFound):
        app.cron.remove("nightly")
    with pytest.raises(InvalidSchedule, match="declared in code"):
        app.cron.pause("code-nightly")


def test_list_shows_code_ones_read_only_beside_managed_ones(app):
    added = app.cron.add("berlin", cron="30 9 * * 1-5", job="cron.ping", payload=Ping(who="b"), tz="Europe/Berlin")
    assert (added.source, added.paused, added.payload) == ("managed", False, {"who": "b"})
    assert added.next_fire is not None and added.next_fire.astimezone(UTC).minute == 30
    app.cron.add("quiet", cron="@daily", job="cron.ping", payload={"who": "q"}, paused=True)
    listed = {s.name: (s.source, s.paused) for s in app.cron.list()}
    assert listed == {"berlin": ("managed", False), "code-nightly": ("code", False), "quiet": ("managed", True)}
    assert app.cron.resume("quiet").paused is False
    assert app.cron.pause("berlin").next_fire is None


def test_the_firer_fires_stored_schedules_once_and_stops_at_the_next_pass(app):
    app.cron.add("every-minute", cron="* * * * *", job="cron.ping", payload={"who": "m"})
    since = schedule_store(app).get("every-minute").since
    # Nothing before it was stored fires (the grace window before then holds a whole minute's occurrence);
    # its first occurrence after does, once for two schedulers.
    first, second = CronFirer(app), CronFirer(app)
    assert first.tick(since - timedelta(seconds=1)) == []
    at = since.replace(second=0, microsecond=0) + timedelta(minutes=1, seconds=5)
    fired = first.tick(at)
    assert [(f.schedule, f.deduplicated) for f in fired] == [("every-minute", False)]
    again = second.tick(at + timedelta(seconds=1))
    assert [(f.job_id, f.deduplicated) for f in again] == [(fired[0].job_id, True)]
    view = app.jobs.get(fired[0].job_id)
    assert view.key == fire_key("every-minute", fired[0].fire_time) and view.job == "cron.ping"

    # A replaced cron counts from the next pass; a pause and a removal stop it there.
    app.cron.add("every-minute", cron="0 0 1 1 *", job="cron.ping", payload={"who": "m"})
    assert CronFirer(app).tick(at + timedelta(minutes=1)) == []
    app.cron.add("every-minute", cron="* * * * *", job="cron.ping", payload={"who": "m"})
    app.cron.pause("every-minute")
    assert first.tick(at + timedelta(minutes=2)) == []
    app.cron.resume("every-minute")
    assert [f.schedule for f in first.tick(at + timedelta(minutes=2))] == ["every-minute"]
    app.cron.remove("every-minute")
    assert first.tick(at + timedelta(minutes=3)) == []


def test_a_stored_schedule_that_no_longer_fits_is_skipped_not_the_others(app):
    now = server_now(app)
    store = schedule_store(app)
    since = now - timedelta(minutes=5)
    # As another deploy of the app could have left them: a job this one lacks, a payload its model refuses.
    store.put(StoredSchedule("gone", "* * * * *", "cron.removed", {}, "UTC", False, since))
    store.put(StoredSchedule("stale", "* * * * *", "cron.ping", {"who": 1}, "UTC", False, since))
    store.put(StoredSchedule("fine", "* * * * *", "cron.ping", {"who": "f"}, "UTC", False, since))
    assert [f.schedule for f in CronFirer(app).tick(now)] == ["fine"]


def test_adding_a_schedule_again_unchanged_keeps_its_due_occurrence(app):
    store = schedule_store(app)
    app.cron.add("deploy", cron="0 3 * * *", job="cron.ping", payload={"who": "d"})
    since = store.get("deploy").since
    # A deploy script applying its schedules again (at 03:00:01, say): the 03:00 occurrence still fires.
    app.cron.add("deploy", cron="0 3 * * *", job="cron.ping", payload={"who": "new payload"})
    assert store.get("deploy").since == since and store.get("deploy").payload == {"who": "new payload"}
    # New times, or a schedule paused before or after: from now on, no catch-up.
    app.cron.add("deploy", cron="0 4 * * *", job="cron.ping", payload={"who": "d"})
    moved = store.get("deploy").since
    assert moved > since
    app.cron.add("deploy", cron="0 4 * * *", job="cron.ping", payload={"who": "d"}, paused=True)
    app.cron.add("deploy", cron="0 4 * * *", job="cron.ping", payload={"who": "d"})
    assert store.get("deploy").since > moved


def test_a_code_schedules_secret_fields_are_masked_where_schedules_are_shown(clean_env, database_url):
    own = Jobs()
    own.job("cron.own_login", queue=Queue("pings"), payload=Login)(login.__wrapped__)
    own.schedule("0 4 * * *", "cron.own_login", Login(password="hunter2-S3CRET"), name="code-login")
    app = App(Settings(broker="inline", database_url=database_url, platform=False, queues={}), jobs=[own])
    try:
        (shown,) = app.cron.list()
        assert shown.payload == {"password": "[redacted]"}
        assert app.cron.get("code-login").payload == {"password": "[redacted]"}
    finally:
        app.close()


def _code_fires(app) -> list[str]:
    """What a pass at 03:00:30 fires (the code schedule's occurrence is due then)."""
    at = server_now(app).replace(hour=3, minute=0, second=30, microsecond=0) + timedelta(days=1)
    return [f.schedule for f in CronFirer(app).tick(at)]


def test_an_unreadable_redis_entry_is_skipped_and_the_rest_fire(clean_env, redis_url, database_url):
    app = App(
        Settings(broker="redis", redis_url=redis_url, database_url=database_url, platform=False, queues={}), jobs=[jobs]
    )
    try:
        store = schedule_store(app)
        store.client.hset(store.key, "odd", b'{"zone": "UTC"}')  # another version's shape, or a hand edit
        assert _code_fires(app) == ["code-nightly"]
        assert [s.name for s in app.cron.list()] == ["code-nightly"]
    finally:
        app.close()


def test_code_schedules_fire_while_the_managed_ones_cannot_be_read(clean_env, database_url):
    import psycopg

    app = App(Settings(broker="postgres", database_url=database_url, platform=False, queues={}), jobs=[jobs])
    try:
        app.cron.add("managed", cron="0 3 * * *", job="cron.ping", payload={"who": "m"})
        with psycopg.connect(database_url, autocommit=True) as conn:
            conn.execute("DROP TABLE conveyor_cron_schedules")  # an app started without its migration
        assert _code_fires(app) == ["code-nightly"]
    finally:
        app.close()
