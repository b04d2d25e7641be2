"""The embedded Postgres of the zero-config default (pgserver)."""

from __future__ import annotations

import json
import os
import shutil
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
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    child = subprocess.run(
        [sys.executable, "-c", code, str(embedded_data_dir)], capture_output=True, text=True, timeout=60, env=env
    )

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


_root_only = pytest.mark.skipif(os.geteuid() != 0, reason="only root runs Postgres as another user")

_CHILD = """
import json, sys
import pgserver, psutil, psycopg
from conveyor.embedded import start_embedded
url = start_embedded(sys.argv[1])
with psycopg.connect(url) as conn:
    pid = conn.execute("SELECT 1").fetchone() and conn.execute(
        "SELECT pid FROM pg_stat_activity WHERE backend_type = 'checkpointer'").fetchone()[0]
print(json.dumps({"pgserver": pgserver.__file__, "exe": psutil.Process(pid).exe(), "url": url}))
"""


@_root_only
def test_as_root_pgserver_installed_inside_a_closed_directory_still_serves(embedded_data_dir):
    """The README's commands from a clone under /root: pgserver sits in a venv the
    server user cannot enter. The server runs from root's copy under the data dir."""
    from importlib.util import find_spec

    site = Path(find_spec("pgserver").origin).resolve().parents[1]  # found, not imported (it warns)
    closed = Path(tempfile.mkdtemp(prefix="conveyor-clone-"))  # 0700, like /root
    try:
        packages = closed / "site-packages"
        shutil.copytree(site / "pgserver", packages / "pgserver")
        if (site / "pgserver.libs").is_dir():
            shutil.copytree(site / "pgserver.libs", packages / "pgserver.libs")
        modes_before = {p: p.stat().st_mode for p in [closed, *closed.rglob("*")]}
        env = {**os.environ, "PYTHONPATH": f"{packages}{os.pathsep}{Path(__file__).resolve().parents[2]}"}
        child = subprocess.run(
            [sys.executable, "-c", _CHILD, str(embedded_data_dir)],
            cwd=closed,
            capture_output=True,
            text=True,
            timeout=120,
            env=env,
        )

        assert child.returncode == 0, child.stderr
        seen = json.loads(child.stdout)
        assert Path(seen["pgserver"]).is_relative_to(closed)  # the closed copy was the one imported
        assert Path(seen["exe"]).is_relative_to(embedded_data_dir / "pgserver")
        # Nothing in or above the closed directory was opened up.
        assert {p: p.stat().st_mode for p in [closed, *closed.rglob("*")]} == modes_before
        # The child was the last user: its exit stopped the server with the copy's pg_ctl.
        assert not (embedded_data_dir / "postgres" / "postmaster.pid").exists()
        with pytest.raises(psycopg.OperationalError):
            _select_one(seen["url"])
    finally:
        shutil.rmtree(closed, ignore_errors=True)


@_root_only
def test_as_root_the_copy_is_made_once_per_pgserver_build(embedded_data_dir):
    cache = embedded_data_dir / "pgserver"
    cache.mkdir(mode=0o755)
    (cache / "0.0.1-0123456789ab" / "pgserver").mkdir(parents=True)  # another build's copy
    (cache / ".partial-999999999-x").mkdir()  # a copy cut short by a crash (its pid is gone)

    start_embedded(embedded_data_dir)
    copies = sorted(p.name for p in cache.iterdir())
    assert len(copies) == 1 and copies[0].startswith(_pgserver_version() + "-")
    postgres = cache / copies[0] / "pgserver" / "pginstall" / "bin" / "postgres"
    stamp = postgres.stat().st_mtime_ns
    assert postgres.stat().st_uid == 0 and postgres.stat().st_mode & 0o777 == 0o755

    stop_embedded(embedded_data_dir)
    start_embedded(embedded_data_dir)  # kept: not copied again
    assert sorted(p.name for p in cache.iterdir()) == copies and postgres.stat().st_mtime_ns == stamp


@_root_only
def test_as_root_a_planted_symlink_for_the_copy_is_refused(embedded_data_dir):
    elsewhere = Path(tempfile.mkdtemp(prefix="conveyor-elsewhere-"))
    try:
        (embedded_data_dir / "pgserver").symlink_to(elsewhere)
        with pytest.raises(ConfigurationError, match="owned by root"):
            start_embedded(embedded_data_dir)
        assert list(elsewhere.iterdir()) == []
    finally:
        shutil.rmtree(elsewhere, ignore_errors=True)


@_root_only
def test_as_root_the_refusal_names_a_data_dir_that_works():
    closed = Path(tempfile.mkdtemp(prefix="conveyor-closed-"))
    try:
        with pytest.raises(ConfigurationError) as refused:
            start_embedded(closed / "data")
        message = str(refused.value)
        assert str(closed) in message and "drwx------" in message
        assert "unset CONVEYOR_DATA_DIR (as root the default is /var/lib/conveyor)" in message
    finally:
        shutil.rmtree(closed, ignore_errors=True)


def _pgserver_version() -> str:
    from importlib import metadata

    return metadata.version("pgserver")


@_root_only
def test_as_root_a_new_pgserver_build_gets_a_new_copy_and_the_old_one_goes_once_unused(embedded_data_dir, monkeypatch):
    import conveyor.embedded as embedded

    cache = embedded_data_dir / "pgserver"
    start_embedded(embedded_data_dir)
    (old,) = cache.iterdir()
    # pgserver upgraded under a running server: its next user gets a new copy; the old one is in use.
    monkeypatch.setattr(embedded, "_build_key", lambda source: "9.9.9-000000000000")
    start_embedded(embedded_data_dir)
    assert sorted(p.name for p in cache.iterdir()) == sorted([old.name, "9.9.9-000000000000"])

    stop_embedded(embedded_data_dir)  # with the new copy's pg_ctl
    url = start_embedded(embedded_data_dir)
    assert [p.name for p in cache.iterdir()] == ["9.9.9-000000000000"]
    assert _select_one(url) == (1, "conveyor")


def _status(data_dir: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """`conveyor status` with nothing configured but the data directory (the embedded default)."""
    env = {
        k: v for k, v in os.environ.items() if not k.startswith("CONVEYOR_") and k not in ("DATABASE_URL", "REDIS_URL")
    }
    env |= {"CONVEYOR_DATA_DIR": str(data_dir), "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    return subprocess.run(
        [sys.executable, "-m", "conveyor", "status", *args], capture_output=True, text=True, timeout=120, env=env
    )


def _postmaster_pid(data_dir: Path) -> int | None:
    from conveyor.embedded import running_embedded

    if running_embedded(data_dir) is None:
        return None
    return int((data_dir / "postgres" / "postmaster.pid").read_text().split()[0])


def test_status_with_no_server_running_says_so_and_starts_none(embedded_data_dir):
    start_embedded(embedded_data_dir)  # an earlier `conveyor up`: the cluster exists, then stopped
    stop_embedded(embedded_data_dir)

    shown = _status(embedded_data_dir, "--json")

    assert shown.returncode == 3, shown.stderr
    assert shown.stdout == ""
    assert "nothing is running" in shown.stderr and "--start" in shown.stderr and "Traceback" not in shown.stderr
    assert _postmaster_pid(embedded_data_dir) is None  # nothing was started (and left behind)


def test_status_reads_the_running_server_and_leaves_it_running(embedded_data_dir):
    from conveyor.embedded import running_embedded

    url = start_embedded(embedded_data_dir)  # this process stands for `conveyor up`
    assert running_embedded(embedded_data_dir) == url
    pid = _postmaster_pid(embedded_data_dir)
    handles = (embedded_data_dir / "postgres" / ".handle_pids.json").read_text()

    shown = _status(embedded_data_dir, "--json")

    assert shown.returncode == 0, shown.stderr
    assert "agent" in {row["queue"] for row in json.loads(shown.stdout)}
    assert _postmaster_pid(embedded_data_dir) == pid  # the same server, neither restarted nor stopped
    assert (embedded_data_dir / "postgres" / ".handle_pids.json").read_text() == handles  # status held no handle
    assert _select_one(url) == (1, "conveyor")


def test_status_start_starts_the_server_for_the_call(embedded_data_dir):
    shown = _status(embedded_data_dir, "--start", "--json")

    assert shown.returncode == 0, shown.stderr
    assert "agent" in {row["queue"] for row in json.loads(shown.stdout)}
    assert _postmaster_pid(embedded_data_dir) is None  # and stopped after, as its only user left
