"""The zero-config default end to end: nothing configured means the Postgres broker on the embedded Postgres."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

from tests.harness import ROOT
from tests.waiting import wait_for


def test_up_with_nothing_configured_runs_a_charge_once_on_the_embedded_postgres(embedded_data_dir, tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("CONVEYOR_") and k not in ("REDIS_URL", "DATABASE_URL", "JOB_FAILURE_WEBHOOK_URL")}
    env.update(HOME=str(home), CONVEYOR_DATA_DIR=str(embedded_data_dir), PYTHONPATH=str(ROOT))

    def conveyor(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "conveyor", *args], env=env, cwd=ROOT, capture_output=True,
                              text=True, timeout=120)

    log = tmp_path / "up.log"
    with open(log, "wb") as out:
        up = subprocess.Popen([sys.executable, "-m", "conveyor", "up"], env=env, cwd=ROOT, stdout=subprocess.DEVNULL,
                              stderr=out, start_new_session=True)
    try:
        assert conveyor("ledger", "top-up", "alice", "10", "--reference", "welcome").returncode == 0
        payload = '{"user_id": "alice", "task_id": "t1", "message_id": "m1", "total_tokens": 2500}'
        for _ in range(2):  # the second enqueue of the same key is a no-op
            assert conveyor("enqueue", "credit.consume", "--payload", payload, "--key", "credit:t1:m1").returncode == 0
        wait_for(lambda: conveyor("ledger", "balance", "alice").stdout.strip() == "9.995000", timeout=60,
                 interval=0.5, message="`conveyor up` to charge the round")
        status = conveyor("status").stdout
        assert "critical" in status and "paused" in status
    finally:
        up.send_signal(signal.SIGTERM)
        try:
            code = up.wait(60)
        finally:
            if up.poll() is None:
                os.killpg(up.pid, signal.SIGKILL)
                up.wait()
    text = log.read_text(errors="replace")
    assert code == 0, text[-2000:]
    assert "broker=postgres" in text and "embedded Postgres" in text
