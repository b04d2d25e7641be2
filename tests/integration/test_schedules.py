"""Cron schedules: validation at creation, racing schedulers, downtime catch-up, DST, and schedule.fire."""

from __future__ import annotations

import json
import logging
import threading
from datetime import UTC, datetime, timedelta

import pytest

from conveyor.errors import InvalidSchedule, ScheduleNotFound
from conveyor.platform.scheduling import schedules
from conveyor.platform.scheduling.scheduler import Scheduler, fire_key
from conveyor.scheduling.cron import Cron
from tests.support.brokers import SERVER_BROKERS
from tests.support.harness import running
from tests.support.sched_jobs import any_broker_app, make_app, runs  # noqa: F401 (fixture)
from tests.support.waiting import wait_for

T0 = datetime(2025, 1, 6, 9, 0, tzinfo=UTC)


def create(app, **kwargs) -> schedules.Schedule:
    with app.pool.connection() as conn:
        return schedules.create_schedule(conn, app.job_types, **kwargs)


@pytest.fixture
def apps():
    made = []

    def make(*args, **kwargs):
        app = make_app(*args, **kwargs)
        made.append(app)
        return app

    yield make
    for app in made:
        app.close()


def test_bad_cron_zone_policy_job_or_payload_is_refused_at_creation(apps, database_url):
    app = apps(database_url)
    good = dict(cron="*/5 * * * *", job="test.record", payload={"note": "n"})
    cases = [
        (dict(good, cron="61 * * * *"), "invalid cron expression '61 * * * *'"),
        (dict(good, cron="* * * *"), "must have 5 fields"),
        (dict(good, cron="0 0 * * * *"), "must have 5 fields"),
        (dict(good, cron="0 0 31 2 *"), "never fires"),
        (dict(good, timezone="Mars/Olympus"), "unknown time zone 'Mars/Olympus'"),
        (dict(good, misfire_policy="sometimes"), "unknown misfire policy 'sometimes'"),
        (dict(good, job="no.such.job"), "unknown job 'no.such.job'"),
        (dict(good, payload={"note": "has spaces"}), "note"),
        (dict(good, job="agent.build", payload={}), "secret fields (env)"),
    ]
    for kwargs, message in cases:
        with pytest.raises(InvalidSchedule, match=message.replace("*", r"\*").replace("(", r"\(").replace(")", r"\)")):
            create(app, **kwargs)
    with app.pool.connection() as conn:
        assert schedules.list_schedules(conn) == []
    created = create(app, **good, timezone="Europe/Berlin", name="every-5", now=T0)
    assert created.next_fire_at == T0 + timedelta(minutes=5)
    with pytest.raises(InvalidSchedule, match="already exists"):
        create(app, **good, name="every-5")
    with app.pool.connection() as conn:
        assert schedules.get_schedule(conn, "every-5").id == created.id
        with pytest.raises(ScheduleNotFound):
            schedules.get_schedule(conn, "sch_missing")


@pytest.mark.parametrize("broker", SERVER_BROKERS)
def test_two_schedulers_racing_fire_each_occurrence_once(apps, database_url, request, broker):
    redis_url = request.getfixturevalue("redis_url") if broker == "redis" else None
    first, second = apps(database_url, redis_url, broker=broker), apps(database_url, redis_url, broker=broker)
    ids = [create(first, cron="* * * * *", job="test.record", payload={"note": f"s{i}"}, now=T0).id for i in range(30)]
    minutes = 5
    fired = []
    for minute in range(1, minutes + 1):
        now = T0 + timedelta(minutes=minute)
        barrier = threading.Barrier(4)
        results = []

        def race(app):
            barrier.wait()
            results.append(Scheduler(app).tick(now=now))

        # Two ticks from each scheduler at the same instant: four passes racing for the same rows.
        threads = [threading.Thread(target=race, args=(app,)) for app in (first, second, first, second)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        fired.extend(f for batch in results for f in batch)

    new = [(f.schedule_id, f.fire_time) for f in fired if not f.deduplicated]
    assert len(new) == len(set(new)) == len(ids) * minutes
    assert set(new) == {(i, T0 + timedelta(minutes=m)) for i in ids for m in range(1, minutes + 1)}
    assert first.broker.queue_counts("scheduling").waiting == len(ids) * minutes

    # A scheduler that enqueued and died before its commit: the next pass enqueues the same keys again,
    # and the JobQueue gives back the first jobs.
    with first.pool.connection() as conn:
        conn.execute("UPDATE schedules SET next_fire_at = %s", (T0 + timedelta(minutes=minutes),))
    again = Scheduler(second).tick(now=T0 + timedelta(minutes=minutes, seconds=30))
    assert len(again) == len(ids) and all(f.deduplicated for f in again)
    assert first.broker.queue_counts("scheduling").waiting == len(ids) * minutes
    assert fire_key(ids[0], T0) == f"schedule:{ids[0]}:2025-01-06T09:00:00Z"


def test_downtime_catch_up_follows_each_schedules_misfire_policy(apps, database_url, caplog):
    app = apps(database_url)
    once = create(app, cron="*/5 * * * *", job="test.record", payload={"note": "once"}, now=T0)
    skip = create(app, cron="*/5 * * * *", job="test.record", payload={"note": "skip"}, now=T0, misfire_policy="skip")
    every = create(app, cron="*/5 * * * *", job="test.record", payload={"note": "all"}, now=T0, misfire_policy="all")
    scheduler = Scheduler(app)

    # Down from 09:00 to 10:02: twelve occurrences (09:05 ... 10:00) were missed.
    with caplog.at_level(logging.INFO, logger="conveyor.events"):
        fired = scheduler.tick(now=T0 + timedelta(minutes=62))
    by = {sid: [f.fire_time for f in fired if f.schedule_id == sid] for sid in (once.id, skip.id, every.id)}
    assert by[once.id] == [T0 + timedelta(minutes=60)]  # one catch-up fire, for the latest slot
    assert by[skip.id] == []  # 10:00 is 120 s late, beyond the 60 s grace
    assert by[every.id] == [T0 + timedelta(minutes=5 * k) for k in range(1, 13)]
    missed = {e["schedule_id"]: e["missed"] for e in _events(caplog, "schedule_missed")}
    assert missed == {once.id: 11, skip.id: 12}
    with app.pool.connection() as conn:
        for s in (once, skip, every):
            assert schedules.get_schedule(conn, s.id).next_fire_at == T0 + timedelta(minutes=65)

    # Back to normal: each schedule fires its next occurrence once, on time.
    fired = scheduler.tick(now=T0 + timedelta(minutes=65, seconds=3))
    assert sorted(f.schedule_id for f in fired) == sorted([once.id, skip.id, every.id])
    assert scheduler.tick(now=T0 + timedelta(minutes=65, seconds=8)) == []


def test_dst_zone_fires_each_wall_time_once_across_both_changes(apps, database_url):
    app = apps(database_url)
    start = datetime(2024, 10, 26, 12, 0, tzinfo=UTC)
    daily = create(
        app, cron="30 2 * * *", timezone="Europe/Berlin", job="test.record", payload={"note": "daily"}, now=start
    )
    hourly = create(
        app, cron="0 * * * *", timezone="Europe/Berlin", job="test.record", payload={"note": "hourly"}, now=start
    )
    scheduler = Scheduler(app)
    fired = []
    now = start
    while now < datetime(2024, 10, 28, 12, 0, tzinfo=UTC):
        now += timedelta(minutes=10)
        fired.extend(scheduler.tick(now=now))
    assert not any(f.deduplicated for f in fired)
    daily_fires = [f.fire_time for f in fired if f.schedule_id == daily.id]
    # 02:30 CEST on the 27th (before the clocks go back), not again at 02:30 CET; then 02:30 CET on the 28th.
    assert daily_fires == [datetime(2024, 10, 27, 0, 30, tzinfo=UTC), datetime(2024, 10, 28, 1, 30, tzinfo=UTC)]
    berlin = Cron.parse("0 * * * *", "Europe/Berlin").zone
    on_27th = [f for f in fired if f.schedule_id == hourly.id and f.fire_time.astimezone(berlin).day == 27]
    assert len(on_27th) == 25  # the repeated hour really passes twice

    # Spring forward: 02:30 does not exist on 2024-03-31 and fires once at 03:00 CEST; hourly skips the hour.
    cron = Cron.parse("30 2 * * *", "Europe/Berlin")
    first = cron.next_after(datetime(2024, 3, 30, 12, 0, tzinfo=UTC))
    assert first == datetime(2024, 3, 31, 1, 0, tzinfo=UTC)
    assert cron.next_after(first) == datetime(2024, 4, 1, 0, 30, tzinfo=UTC)
    hourly_cron = Cron.parse("0 * * * *", "Europe/Berlin")
    day = hourly_cron.between(datetime(2024, 3, 30, 23, 0, tzinfo=UTC), datetime(2024, 3, 31, 21, 59, tzinfo=UTC), 100)
    assert len(day) == 23


def test_schedule_fire_enqueues_the_job_and_skips_paused_or_deleted_schedules(any_broker_app, caplog):
    app = any_broker_app
    live = create(app, cron="* * * * *", job="test.record", payload={"note": "live"}, now=T0)
    paused = create(app, cron="* * * * *", job="test.record", payload={"note": "paused"}, now=T0)
    gone = create(app, cron="* * * * *", job="test.record", payload={"note": "gone"}, now=T0)
    fired = Scheduler(app).tick(now=T0 + timedelta(minutes=1))
    assert len(fired) == 3
    with app.pool.connection() as conn:
        schedules.pause_schedule(conn, paused.id)
        schedules.delete_schedule(conn, gone.id)

    def fires(schedule_id: str) -> list[schedules.FireRecord]:
        with app.pool.connection() as conn:
            return schedules.fires(conn, schedule_id)

    caplog.set_level(logging.INFO, logger="conveyor.events")
    with running(app, "scheduling", "indexing"):
        wait_for(
            lambda: (
                runs(app) == [{"note": "live"}] and len(fires(paused.id)) == 1 and len(_events(caplog, "skipped")) == 2
            ),
            timeout=20,
            message="fires handled",
        )
    (live_fire,) = fires(live.id)
    assert live_fire.status == "enqueued" and live_fire.fire_time == T0 + timedelta(minutes=1)
    (paused_fire,) = fires(paused.id)
    assert (paused_fire.status, paused_fire.reason) == ("skipped", "schedule is paused")
    reasons = sorted(e["reason"] for e in _events(caplog, "skipped"))
    assert reasons == ["schedule is paused", "schedule was deleted"]
    # Resuming does not catch up what was missed while paused.
    with app.pool.connection() as conn:
        resumed = schedules.resume_schedule(conn, paused.id, now=T0 + timedelta(hours=3))
    assert resumed.enabled and resumed.next_fire_at == T0 + timedelta(hours=3, minutes=1)


def _events(caplog, name: str) -> list[dict]:
    out = []
    for record in caplog.records:
        if record.name == "conveyor.events":
            event = json.loads(record.getMessage())
            if event["event"] == name:
                out.append(event)
    return out
