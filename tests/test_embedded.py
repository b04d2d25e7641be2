"""The embedded Postgres of the zero-config default (pgserver)."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

import psycopg
import pytest

from conveyor.embedded import start_embedded, stop_embedded
from conveyor.errors import ConfigurationError


def _select_one(url: str) -> tuple:
    with psycopg.connect(url, connect_timeout=10) as conn:
        return conn.execute("SELECT 1, current_database()").fetchone()


def test_embedded_postgres_starts_answers_and_stops(embedded_data_dir):
    url = start_embedded(embedded_data_dir)

    assert _select_one(url) == (1, "conveyor")
    assert start_embedded(embedded_data_dir) == url  # found running, same server

    stop_embedded(embedded_data_dir)
    with pytest.raises(psycopg.OperationalError):
        _select_one(url)
    stop_embedded(embedded_data_dir)  # already stopped: nothing to do


def test_embedded_postgres_keeps_data_across_a_restart(embedded_data_dir):
    url = start_embedded(embedded_data_dir)
    with psycopg.connect(url) as conn:
        conn.execute("CREATE TABLE kept AS SELECT 7 AS x")
    stop_embedded(embedded_data_dir)

    url = start_embedded(embedded_data_dir)
    with psycopg.connect(url) as conn:
        assert conn.execute("SELECT x FROM kept").fetchone() == (7,)


def test_another_process_gets_the_same_server_and_leaves_it_running(embedded_data_dir):
    url = start_embedded(embedded_data_dir)
    code = "import sys; from conveyor.embedded import start_embedded; print(start_embedded(sys.argv[1]))"
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    child = subprocess.run([sys.executable, "-c", code, str(embedded_data_dir)],
                           capture_output=True, text=True, timeout=60, env=env)

    assert child.returncode == 0, child.stderr
    assert child.stdout.strip() == url
    # The child has exited; we still hold the server, so it must still answer.
    assert _select_one(url) == (1, "conveyor")


@pytest.mark.skipif(os.geteuid() != 0, reason="only root needs another user to run Postgres")
def test_as_root_a_data_dir_behind_a_closed_directory_is_refused_untouched():
    closed = Path(tempfile.mkdtemp(prefix="conveyor-closed-"))  # 0700, like /root
    try:
        with pytest.raises(ConfigurationError, match="CONVEYOR_DATA_DIR"):
            start_embedded(closed / "data")
        assert closed.stat().st_mode & 0o777 == 0o700
    finally:
        subprocess.run(["rm", "-rf", str(closed)], check=True)
