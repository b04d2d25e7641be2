"""`conveyor demo` as a user runs it: a subprocess that starts its own workers and checks itself."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from tests.support.harness import FAST, FAST_QUEUES


def _demo(clean_env, *args: str, timeout: float = 150) -> tuple[subprocess.CompletedProcess, float]:
    # The injected faults retry after each queue's backoff: 5 s and more on llm, 2 s on agent by
    # default, most of the demo's time. Shortened through settings; the retries still happen.
    for queue, override in FAST_QUEUES.items():
        for name, value in override.items():
            clean_env.setenv(f"CONVEYOR_QUEUES__{queue.upper()}__{name.upper()}", str(value))
    clean_env.setenv("CONVEYOR_WORKER_IDLE_TIMEOUT", str(FAST["worker_idle_timeout"]))  # a quicker stop at the end
    started = time.monotonic()
    result = subprocess.run(
        [sys.executable, "-m", "conveyor", "demo", *args], capture_output=True, text=True, timeout=timeout
    )
    return result, time.monotonic() - started


@pytest.mark.slow
def test_demo_on_redis_completes_and_passes_its_own_checks(clean_env, redis_url, database_url):
    clean_env.setenv("CONVEYOR_BROKER", "redis")
    clean_env.setenv("REDIS_URL", redis_url)
    clean_env.setenv("DATABASE_URL", database_url)
    result, elapsed = _demo(clean_env, "--runs", "6", "--fault-rate", "0.3")

    assert result.returncode == 0, result.stdout + result.stderr
    assert "all checks passed" in result.stdout
    assert "runs completed" in result.stdout and "6/6" in result.stdout
    assert "FAIL" not in result.stdout
    assert elapsed < 90
    # It ends by saying what to run next, on lines a pipe gets whole (no 80-column wrapping).
    assert "next:\n  conveyor up " in result.stdout
    assert any("dashboard at http://127.0.0.1:8000/admin/queues" in line for line in result.stdout.splitlines())


def test_demo_exits_non_zero_when_a_check_fails(clean_env, database_url):
    clean_env.setenv("CONVEYOR_BROKER", "inline")
    clean_env.setenv("DATABASE_URL", database_url)
    result, _ = _demo(clean_env, "--runs", "2", "--timeout", "0")

    assert result.returncode == 1, result.stdout + result.stderr
    assert "FAIL" in result.stdout and "check(s) failed" in result.stdout


@pytest.mark.slow
def test_demo_on_the_embedded_default_with_nothing_configured(clean_env, embedded_data_dir):
    clean_env.setenv("CONVEYOR_DATA_DIR", str(embedded_data_dir))
    result, elapsed = _demo(clean_env, "--runs", "6")

    assert result.returncode == 0, result.stdout + result.stderr
    assert "all checks passed" in result.stdout
    assert "embedded Postgres" in result.stdout
    assert elapsed < 90
