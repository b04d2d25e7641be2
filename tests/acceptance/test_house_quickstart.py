"""The README's quickstart, pasted verbatim into an empty directory, works (issue 19.7).

The fenced blocks under ``## Quickstart`` are taken from README.md as they are: each Python
block that starts with ``# <file>`` is written to that file, and the shell block runs as one
bash script, its worker in the background as written. No platform, no PYTHONPATH: only the
installed conveyor: on the embedded Postgres as the README has it, and on the test's private
servers through REDIS_URL or DATABASE_URL.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import psycopg
import pytest

from tests.support.brokers import SERVER_BROKERS
from tests.support.harness import ROOT, env_for, make_settings
from tests.support.waiting import wait_for

FENCE = re.compile(r"^```(\w+)\n(.*?)^```$", re.S | re.M)


def quickstart() -> tuple[dict[str, str], str]:
    """The quickstart's files ({name: text}) and its shell script."""
    readme = (ROOT / "README.md").read_text()
    section = readme.split("\n## Quickstart\n", 1)[1].split("\n## ", 1)[0]
    files, script = {}, ""
    for language, body in FENCE.findall(section):
        if language == "python":
            name = body.splitlines()[0].removeprefix("# ").strip()
            files[name] = body
        elif language == "sh":
            script += body
    return files, script


def test_the_readme_has_a_short_quickstart():
    files, script = quickstart()
    assert list(files) == ["tasks.py"] and "conveyor worker" in script
    lines = [line for text in [*files.values(), script] for line in text.splitlines() if line.strip()]
    assert len(lines) <= 20, "about ten lines: a queue, a job, a worker, an enqueue, a result"


@pytest.mark.parametrize("broker", SERVER_BROKERS)
def test_the_quickstart_pasted_into_an_empty_directory_runs(broker, clean_env, redis_url, database_url, tmp_path):
    env = env_for(make_settings(broker, redis_url, database_url, queues={}, imports=""))
    del env["PYTHONPATH"]
    env.pop("CONVEYOR_IMPORTS")
    _run_quickstart(tmp_path, env)


def test_the_quickstart_runs_with_nothing_configured_on_the_embedded_postgres(clean_env, embedded_data_dir, tmp_path):
    """As a newcomer runs it: no server, no URL, no PYTHONPATH; both processes share one embedded Postgres
    (its data directory is the test's own, not the user's default)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # clean_env took conveyor's settings out
    env["CONVEYOR_DATA_DIR"] = str(embedded_data_dir)
    _run_quickstart(tmp_path, env)


def test_the_quickstart_runs_on_a_new_database_of_ones_own_after_conveyor_migrate(clean_env, make_database, tmp_path):
    """The README's note for DATABASE_URL: without the migrate the enqueue raced the worker's
    migrations and failed (column "rank_lead" does not exist, 3 runs of 3)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["DATABASE_URL"] = make_database()  # empty: no template
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    migrate = {**env, "CONVEYOR_PLATFORM": "false"}  # as the README says: the library's tables, no platform's
    done = subprocess.run(
        ["conveyor", "migrate"], env=migrate, cwd=tmp_path, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    with psycopg.connect(env["DATABASE_URL"]) as conn:
        tables = {row[0] for row in conn.execute("SELECT tablename FROM pg_tables WHERE schemaname = 'public'")}
    assert "conveyor_jobs" in tables and "runs" not in tables  # the platform's runs table stays out
    _run_quickstart(tmp_path, env)


def test_conveyor_up_for_the_quickstarts_app_runs_its_queue_and_migrates_no_platform_table(
    clean_env, make_database, tmp_path
):
    """``conveyor up`` with the platform off: the user's queue, the library's tables, nothing of the platform's."""
    files, script = quickstart()
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    enqueue = next(line for line in script.splitlines() if line.startswith("python -c"))
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env |= {"DATABASE_URL": make_database(), "CONVEYOR_PLATFORM": "false", "CONVEYOR_IMPORTS": "tasks"}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    err = tmp_path / "up.stderr"
    with err.open("wb") as stderr:
        up = subprocess.Popen(
            ["conveyor", "up", "--port", "0"], cwd=tmp_path, env=env, stderr=stderr, start_new_session=True
        )
    try:
        wait_for(lambda: "stops it after in-flight jobs" in err.read_text(), timeout=60, message="conveyor up")
        assert "queues=math\n" in err.read_text()
        done = subprocess.run(
            ["bash", "-c", enqueue], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120
        )
        assert (done.returncode, done.stdout.split()) == (0, ["5"]), done.stderr[-3000:]
    finally:
        up.terminate()
        try:
            assert up.wait(timeout=60) == 0, err.read_text()[-3000:]
        finally:
            _stop_group(up.pid)  # its children, should any outlive it
    with psycopg.connect(env["DATABASE_URL"]) as conn:
        tables = {row[0] for row in conn.execute("SELECT tablename FROM pg_tables WHERE schemaname = 'public'")}
    assert "conveyor_jobs" in tables and "runs" not in tables and "schedules" not in tables
    assert "Traceback" not in err.read_text()


def _run_quickstart(directory: Path, env: dict[str, str]) -> None:
    """Write the quickstart's files into ``directory`` and run its script there: it prints 5, cleanly."""
    files, script = quickstart()
    for name, text in files.items():
        (directory / name).write_text(text)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"  # `python`, `conveyor`
    out, err = directory / "stdout", directory / "stderr"
    with out.open("wb") as stdout, err.open("wb") as stderr:
        shell = subprocess.Popen(
            ["bash", "-c", script], cwd=directory, env=env, stdout=stdout, stderr=stderr, start_new_session=True
        )
    try:
        assert shell.wait(timeout=180) == 0, err.read_text()[-3000:]
        assert out.read_text().split() == ["5"], err.read_text()[-3000:]
    finally:
        _stop_group(shell.pid)
    assert "Traceback" not in err.read_text()


def _stop_group(pgid: int) -> None:
    """SIGTERM the script's process group (the background worker), then wait for it to drain."""
    try:
        os.killpg(pgid, signal.SIGTERM)
    except ProcessLookupError:
        return

    def gone() -> bool:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return True
        return False

    try:
        wait_for(gone, timeout=60, message="the quickstart's worker to stop")
    finally:
        if not gone():
            os.killpg(pgid, signal.SIGKILL)
            time.sleep(0.1)
