"""The public API as a user meets it: a job module that imports only ``conveyor``, on its own queue,
run by ``conveyor worker`` as a subprocess with the agent platform switched off (CONVEYOR_PLATFORM=false).

The user's module is written to a temporary directory and imported only by the subprocesses,
so this test leaves the pytest process's job registry as it found it.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
import uuid

import pytest

from tests.support.brokers import SERVER_BROKERS
from tests.support.harness import ROOT, WorkerProcess, env_for, make_settings, probe_runs
from tests.support.waiting import wait_for

USER_MODULE = '''
"""A user's job module: it needs nothing but ``conveyor``."""
import os

from conveyor import Payload, Queue, job

MAIL = Queue("mail", concurrency=2, max_attempts=4, min_backoff=0.05, max_backoff=0.1, time_limit=30)


class Send(Payload):
    token: str


@job("mail.send", queue=MAIL, payload=Send)
def send(payload: Send, ctx) -> None:
    if ctx.attempt == 1:
        raise RuntimeError("the first attempt fails, so the user's queue's retry settings are used")
    with ctx.app.pool.connection() as conn:
        conn.execute("INSERT INTO probe_runs (token, job_id, attempt, pid) VALUES (%s, %s, %s, %s)",
                     (payload.token, ctx.job_id, ctx.attempt, os.getpid()))
'''


@pytest.fixture(params=SERVER_BROKERS)
def user_env(request, clean_env, redis_url, database_url, tmp_path):
    module = f"user_jobs_{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{module}.py").write_text(textwrap.dedent(USER_MODULE))
    settings = make_settings(request.param, redis_url, database_url, imports=module, queues={})
    return settings, {"CONVEYOR_PLATFORM": "false", "PYTHONPATH": f"{tmp_path}:{ROOT}"}


def cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "conveyor", *args], env=env, cwd=ROOT, capture_output=True, text=True, timeout=120
    )


def test_a_users_job_on_its_own_queue_runs_with_the_platform_off(user_env, tmp_path):
    settings, extra = user_env
    env = env_for(settings, **extra)
    token = uuid.uuid4().hex
    worker = WorkerProcess(settings, "mail", log=tmp_path / "worker.log", **extra)
    try:
        sent = cli(env, "enqueue", "mail.send", "--payload", f'{{"token": "{token}"}}')
        assert sent.returncode == 0, sent.stderr
        runs = wait_for(
            lambda: probe_runs(settings.database_url, token),
            timeout=90,
            message="the user's job to run on its own queue",
        )
        assert [r["attempt"] for r in runs] == [2]
        # The platform is off: its jobs are unknown and its queues are not there.
        refused = cli(env, "enqueue", "credit.consume", "--payload", "{}")
        assert refused.returncode == 2 and "unknown job 'credit.consume'" in refused.stderr
        status = cli(env, "status", "--json")
        assert status.returncode == 0, status.stderr
        assert [row["queue"] for row in __import__("json").loads(status.stdout)] == ["mail"]
    finally:
        assert worker.terminate() == 0
    assert {e["queue"] for e in worker.events("worker_started")} == {"mail"}


def test_the_platform_loads_by_default(clean_env, tmp_path):
    env = {k: v for k, v in env_for(make_settings("inline", None, "postgresql://unused/db")).items()}
    shown = subprocess.run(
        [
            sys.executable,
            "-c",
            "from conveyor import App; a = App(); print(','.join(a.queues)); print('credit.consume' in a.job_types)",
        ],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.split() == ["agent,build,critical,llm,indexing,scheduling,nudge", "True"]
