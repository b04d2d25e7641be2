"""``conveyor up`` from a clean HOME with no service running: the embedded default end to end."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile

import httpx

from tests.support.harness import ROOT
from tests.support.servers import free_port
from tests.support.waiting import wait_for


def test_up_then_enqueue_in_another_shell_moves_the_balance_once(clean_env, embedded_data_dir, tmp_path):
    home = tempfile.mkdtemp(prefix="conveyor-home-")
    env = {
        k: v for k, v in os.environ.items() if not k.startswith("CONVEYOR_") and k not in ("REDIS_URL", "DATABASE_URL")
    }
    port = free_port()
    env.update(
        HOME=home,
        PYTHONPATH=str(ROOT),
        CONVEYOR_DATA_DIR=str(embedded_data_dir),
        CONVEYOR_SHUTDOWN_TIMEOUT="20",
        CONVEYOR_WORKER_IDLE_TIMEOUT="0.1",  # six idle worker groups stop at the end
        CONVEYOR_API_PORT=str(port),
        CONVEYOR_ADMIN_TOKEN="up-token-core-4b8f1",
        CONVEYOR_METRICS_PORT="0",
    )
    log = tmp_path / "up.log"

    def conveyor(*args):
        return subprocess.run(
            [sys.executable, "-m", "conveyor", *args], env=env, cwd=ROOT, capture_output=True, text=True, timeout=120
        )

    with open(log, "wb") as out:
        up = subprocess.Popen(
            [sys.executable, "-m", "conveyor", "up"],
            env=env,
            cwd=ROOT,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:

        def started():
            text = log.read_text(errors="replace")
            return text.count('"event":"worker_started"') >= 6

        wait_for(started, timeout=120, message="conveyor up to start a worker group per queue")
        assert "embedded Postgres" in log.read_text()
        # One line per fact: the process that started the server says so, the other six found it.
        assert log.read_text().count("embedded postgres ready") <= 1
        payload = json.dumps({"user_id": "newcomer", "task_id": "t1", "message_id": "m1", "total_tokens": 5000})
        for _ in range(2):
            result = conveyor("enqueue", "credit.consume", "--payload", payload, "--key", "credit:t1:m1")
            assert result.returncode == 0, result.stderr
        # Wait on the log, not by polling the CLI (a second of interpreter start-up per look,
        # competing with the stack's); then the CLI must show the charge.
        wait_for(
            lambda: '"event":"completed"' in log.read_text(errors="replace"),
            timeout=60,
            message="the charge to be applied by the embedded stack",
        )
        assert conveyor("ledger", "balance", "newcomer").stdout.strip() == "-0.010000"
        assert conveyor("ledger", "verify").returncode == 0

        def charged_once():
            metrics = _get(f"http://127.0.0.1:{port}/api/admin/queue-metrics", "up-token-core-4b8f1")
            return metrics and metrics["critical"]["completedTotal"] == 1

        wait_for(charged_once, message="the API that conveyor up started to count the charge")
    finally:
        up.send_signal(signal.SIGTERM)
        code = up.wait(60)
    assert code == 0, log.read_text()[-3000:]


def _get(url: str, token: str):
    try:
        response = httpx.get(url, headers={"Authorization": f"Bearer {token}"}, timeout=5)
    except httpx.TransportError:
        return None
    return response.json() if response.status_code == 200 else None
