"""The ``conveyor`` command as a user runs it: real subprocesses, real servers."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.support.brokers import SERVER_BROKERS
from tests.support.harness import ROOT, WorkerProcess, env_for, make_settings
from tests.support.waiting import wait_for


@pytest.fixture(params=SERVER_BROKERS)
def settings(request, clean_env, redis_url, database_url):
    return make_settings(request.param, redis_url, database_url)


def conveyor(settings, *args, stdin=None):
    return subprocess.run(
        [sys.executable, "-m", "conveyor", *args],
        env=env_for(settings),
        cwd=ROOT,
        input=stdin,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_help_names_every_environment_variable(settings):
    out = conveyor(settings, "--help").stdout
    for name in (
        "REDIS_URL",
        "DATABASE_URL",
        "JOB_FAILURE_WEBHOOK_URL",
        "CONVEYOR_BROKER",
        "CONVEYOR_DEDUP_TTL",
        "CONVEYOR_HEARTBEAT_TIMEOUT",
        "CONVEYOR_QUEUES",
    ):
        assert name in out
    worker_help = conveyor(settings, "worker", "--help").stdout
    assert "CONVEYOR_WORKER_QUEUES" in worker_help and "CONVEYOR_WORKER_PROCESSES" in worker_help


def test_migrate_worker_enqueue_moves_the_balance_once(settings, tmp_path):
    assert conveyor(settings, "migrate").returncode == 0
    assert json.loads(conveyor(settings, "migrate").stdout)["applied"] == []  # piped: one JSON line
    assert conveyor(settings, "ledger", "top-up", "alice", "10", "--reference", "welcome").returncode == 0
    payload = json.dumps({"user_id": "alice", "task_id": "t1", "message_id": "m1", "total_tokens": 2500})
    first = json.loads(
        conveyor(settings, "enqueue", "credit.consume", "--payload", payload, "--key", "credit:t1:m1").stdout
    )
    again = json.loads(
        conveyor(settings, "enqueue", "credit.consume", "--payload", payload, "--key", "credit:t1:m1").stdout
    )
    assert again == {"id": first["id"], "deduplicated": True}
    worker = WorkerProcess(settings, "critical", log=tmp_path / "worker.log")
    try:
        # Wait on the worker's own log, not by polling the CLI: each `conveyor` run is a second of
        # interpreter start-up, competing with the worker's for the CPU. Then the CLI must show it.
        wait_for(lambda: worker.events("completed"), timeout=60, message="the charge to be applied")
        assert conveyor(settings, "ledger", "balance", "alice").stdout.strip() == "9.995000"

        def critical_status():
            status = json.loads(conveyor(settings, "status", "--json").stdout)
            return next(q for q in status if q["queue"] == "critical")

        # The ack lands a moment after the charge (acks are batched).
        critical = wait_for(lambda: (c := critical_status())["completed_total"] == 1 and c, timeout=30)
        assert critical["waiting"] == 0
    finally:
        assert worker.terminate() == 0
    assert conveyor(settings, "ledger", "verify").returncode == 0


def test_enqueue_errors_are_clear_and_exit_non_zero(settings):
    bad = conveyor(settings, "enqueue", "credit.consume", "--payload", '{"user_id": "a"}')
    assert bad.returncode == 2 and "invalid payload for job 'credit.consume'" in bad.stderr
    assert "task_id" in bad.stderr and "Traceback" not in bad.stderr
    unknown = conveyor(settings, "enqueue", "nope.job", "--payload", "{}")
    assert unknown.returncode == 2 and "unknown job 'nope.job'" in unknown.stderr


def test_batch_enqueue_reads_json_lines(settings):
    lines = "\n".join(
        json.dumps(
            {
                "job": "credit.consume",
                "key": f"credit:t:{i % 2}",
                "payload": {"user_id": "u", "task_id": "t", "message_id": str(i % 2), "total_tokens": 1},
            }
        )
        for i in range(4)
    )
    out = conveyor(settings, "enqueue", "--batch", stdin=lines)
    rows = [json.loads(line) for line in out.stdout.splitlines()]
    assert [r["deduplicated"] for r in rows] == [False, False, True, True]


def test_verify_exits_non_zero_on_a_mismatch(settings, database_url):
    import psycopg

    conveyor(settings, "ledger", "top-up", "bob", "1", "--reference", "r1")
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute("UPDATE credit_accounts SET balance = 2 WHERE user_id = 'bob'")
    result = conveyor(settings, "ledger", "verify")
    assert result.returncode == 1 and "MISMATCH bob" in result.stderr


def test_enqueue_takes_a_priority_flag_and_a_batch_field(settings):
    payload = {"user_id": "u", "task_id": "t", "message_id": "m", "total_tokens": 1}
    one = conveyor(settings, "enqueue", "credit.consume", "--payload", json.dumps(payload), "--priority", "7")
    assert one.returncode == 0, one.stderr
    bad = conveyor(settings, "enqueue", "credit.consume", "--payload", json.dumps(payload), "--priority", "12x")
    assert bad.returncode == 2 and "must be an integer 0-9" in bad.stderr and "12x" not in bad.stderr
    line = json.dumps({"job": "credit.consume", "payload": {**payload, "message_id": "m2"}, "priority": 3})
    assert conveyor(settings, "enqueue", "--batch", stdin=line).returncode == 0
    wrong = json.dumps({"job": "credit.consume", "payload": payload, "priority": 10})
    refused = conveyor(settings, "enqueue", "--batch", stdin=wrong)
    assert refused.returncode != 0 and "priority" in refused.stderr and "Traceback" not in refused.stderr
    status = json.loads(conveyor(settings, "status", "--json").stdout)
    assert next(q for q in status if q["queue"] == "critical")["waiting"] == 2
