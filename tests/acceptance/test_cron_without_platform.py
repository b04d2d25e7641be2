"""A user's cron job fires with the agent platform absent (issue 19.4): ``conveyor scheduler``
fires the schedules a user's blueprint declares, and ``conveyor worker`` runs what it enqueued.

Before, ``conveyor scheduler`` with CONVEYOR_PLATFORM=false exited 2 (``unknown job
'schedule.fire'``) and a schedule never fired.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from tests.support.brokers import SERVER_BROKERS
from tests.support.harness import env_for, make_settings
from tests.support.waiting import wait_for

CONVEYOR = str(Path(sys.executable).parent / "conveyor")

USER_JOBS = """
from pathlib import Path

from conveyor import Jobs, Payload, Queue

jobs = Jobs()


class Tick(Payload):
    note: str


@jobs.job("user.tick", queue=Queue("ticks"), payload=Tick)
def tick(payload: Tick, ctx) -> None:
    (Path(__file__).parent / f"ran-{ctx.job_id}").write_text(payload.note)


jobs.schedule("* * * * *", tick, Tick(note="every minute"))
"""


@pytest.mark.parametrize("broker", SERVER_BROKERS)
def test_a_users_cron_job_fires_once_and_runs_with_the_platform_off(
    broker, clean_env, redis_url, database_url, tmp_path
):
    (tmp_path / "userjobs.py").write_text(textwrap.dedent(USER_JOBS))
    settings = make_settings(broker, redis_url, database_url, queues={})
    env = env_for(settings, CONVEYOR_PLATFORM="false", CONVEYOR_IMPORTS="userjobs")
    del env["PYTHONPATH"]
    # Every minute, and up to two minutes late still counts: a pass always finds an occurrence.
    env["CONVEYOR_SCHEDULER_MISFIRE_GRACE"] = "120"

    def scheduler_once() -> dict:
        done = subprocess.run(
            [CONVEYOR, "scheduler", "--once"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60
        )
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout)

    first = scheduler_once()
    assert first["fired"] >= 1
    # A second scheduler's pass: the same occurrences, deduplicated (one more if a minute turned meanwhile).
    second = scheduler_once()
    assert second["deduplicated"] >= 1 and second["fired"] <= 1
    fired = first["fired"] + second["fired"]
    since = time.time()
    worker = subprocess.Popen(
        [CONVEYOR, "worker"], cwd=tmp_path, env=env, stderr=subprocess.PIPE, start_new_session=True
    )
    try:
        wait_for(
            lambda: len(list(tmp_path.glob("ran-*"))) >= fired,
            timeout=60,
            message="the fired occurrences to run on the user's worker",
        )
        time.sleep(0.5)  # a doubled occurrence would run by now
    finally:
        worker.terminate()
        _, err = worker.communicate(timeout=60)
    assert worker.returncode == 0, err.decode(errors="replace")[-2000:]
    # The worker fires schedules too: a minute that turned while it ran is one more occurrence, once.
    turned = int(time.time() // 60) - int(since // 60)
    assert fired <= len(list(tmp_path.glob("ran-*"))) <= fired + turned
    assert {p.read_text() for p in tmp_path.glob("ran-*")} == {"every minute"}


@pytest.mark.parametrize("broker", SERVER_BROKERS)
def test_workers_fire_the_schedules_themselves_once_each(broker, clean_env, redis_url, database_url, tmp_path):
    (tmp_path / "userjobs.py").write_text(textwrap.dedent(USER_JOBS))
    settings = make_settings(broker, redis_url, database_url, queues={})
    env = env_for(settings, CONVEYOR_PLATFORM="false", CONVEYOR_IMPORTS="userjobs")
    del env["PYTHONPATH"]
    env["CONVEYOR_SCHEDULER_MISFIRE_GRACE"] = "70"  # a pass always finds one or two occurrences
    env["CONVEYOR_SCHEDULER_INTERVAL"] = "0.2"
    # No scheduler: three worker processes fire, each occurrence once.
    worker = subprocess.Popen(
        [CONVEYOR, "worker", "--processes", "3"], cwd=tmp_path, env=env, stderr=subprocess.PIPE, start_new_session=True
    )
    try:
        wait_for(lambda: list(tmp_path.glob("ran-*")), timeout=60, message="a worker-fired occurrence to run")
        time.sleep(1.5)  # several more passes of every process: none may enqueue the same occurrence again
    finally:
        worker.terminate()
        _, err = worker.communicate(timeout=60)
    assert worker.returncode == 0, err.decode(errors="replace")[-2000:]
    fired = [json.loads(line) for line in err.decode().splitlines() if '"schedule_fired"' in line]
    assert fired and len({f["fire_time"] for f in fired}) == len(fired), "an occurrence enqueued twice"
    assert 1 <= len(list(tmp_path.glob("ran-*"))) <= len(fired)  # one not yet run at the stop stays queued
