"""Managed cron schedules with the agent platform absent (issue 19): schedules added with a real
``conveyor cron add`` are fired by two real ``conveyor scheduler`` processes at once, each occurrence
once, and run by a real worker; ``conveyor cron pause`` and ``remove`` stop them at the next pass.

Cron has minutes, so this waits for two minute boundaries (about 1-2 minutes per broker).
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import time
from collections import Counter
from datetime import datetime
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
    (Path(__file__).parent / f"ran-{payload.note}-{ctx.job_id}").write_text(payload.note)
"""


@pytest.mark.parametrize("broker", SERVER_BROKERS)
def test_cli_added_schedules_fire_once_across_two_schedulers_and_stop_when_paused_or_removed(
    broker, clean_env, redis_url, database_url, tmp_path
):
    (tmp_path / "userjobs.py").write_text(textwrap.dedent(USER_JOBS))
    settings = make_settings(broker, redis_url, database_url, queues={})
    env = env_for(settings, CONVEYOR_PLATFORM="false", CONVEYOR_IMPORTS="userjobs")
    del env["PYTHONPATH"]
    env["CONVEYOR_SCHEDULER_INTERVAL"] = "0.2"
    env["CONVEYOR_WORKER_SCHEDULES"] = "false"  # only the two schedulers fire

    def cron(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [CONVEYOR, "cron", *args], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60
        )

    def runs(note: str) -> int:
        return len(list(tmp_path.glob(f"ran-{note}-*")))

    refused = cron("add", "x", "--cron", "61 * * * *", "--job", "user.tick", "--payload", '{"note": "x"}')
    assert refused.returncode == 2 and refused.stderr.count("\n") == 1 and "Traceback" not in refused.stderr
    assert "cron:" in refused.stderr and "61" not in refused.stderr

    for name in ("paused-later", "removed-later", "control"):
        added = cron("add", name, "--cron", "* * * * *", "--job", "user.tick", "--payload", json.dumps({"note": name}))
        assert added.returncode == 0, added.stderr
    listed = [json.loads(line) for line in cron("list", "--json").stdout.splitlines()]
    assert [(s["name"], s["source"], s["paused"]) for s in listed] == [
        ("control", "managed", False),
        ("paused-later", "managed", False),
        ("removed-later", "managed", False),
    ]

    logs = [tmp_path / "scheduler-1.log", tmp_path / "scheduler-2.log"]
    outputs = [log.open("wb") for log in logs]
    processes = [
        subprocess.Popen([CONVEYOR, "scheduler"], cwd=tmp_path, env=env, stderr=out, start_new_session=True)
        for out in outputs
    ]
    processes.append(
        subprocess.Popen([CONVEYOR, "worker"], cwd=tmp_path, env=env, stderr=subprocess.DEVNULL, start_new_session=True)
    )
    try:
        # The first minute boundary after they were added: each fires once.
        wait_for(
            lambda: all(runs(n) == 1 for n in ("paused-later", "removed-later", "control")),
            timeout=90,
            message="each schedule's first occurrence to run",
        )
        assert cron("pause", "paused-later").returncode == 0
        assert cron("remove", "removed-later").returncode == 0
        # The next boundary: the control fires again, the paused and the removed one do not.
        wait_for(lambda: runs("control") == 2, timeout=90, message="the control's second occurrence to run")
        time.sleep(1.0)  # one enqueued at that boundary too would have run by now, beside the control's
    finally:
        for process in processes:
            process.terminate()
        codes = [process.wait(timeout=60) for process in processes]
        for out in outputs:
            out.close()
    assert codes == [0, 0, 0]
    assert (runs("paused-later"), runs("removed-later")) == (1, 1)

    fired = [json.loads(line) for log in logs for line in log.read_text().splitlines() if '"schedule_fired"' in line]
    # Between the two schedulers, every occurrence was enqueued once (the other found it deduplicated).
    by_occurrence = Counter((f["schedule"], f["fire_time"]) for f in fired)
    assert set(by_occurrence.values()) == {1}, by_occurrence
    first = min(datetime.fromisoformat(f["fire_time"]) for f in fired)
    after_first = sorted(s for s, t in by_occurrence if datetime.fromisoformat(t) > first)
    assert set(after_first) <= {"control"}, after_first
    assert [s["name"] for s in (json.loads(line) for line in cron("list", "--json").stdout.splitlines())] == [
        "control",
        "paused-later",
    ]
