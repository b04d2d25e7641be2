"""Long CLI commands: a bar and a sentence on a terminal, one JSON summary line through pipes.

The terminal runs go through a real pseudo-terminal (``pty``), stdin still
being the file, as in ``conveyor enqueue --batch < jobs.jsonl`` typed at a shell.
"""

from __future__ import annotations

import fcntl
import json
import os
import pty
import struct
import subprocess
import sys
import termios
from pathlib import Path

import pytest

from conveyor.platform.blueprint import jobs as platform
from conveyor.schema.migrate import migration_files
from tests.support.brokers import SERVER_BROKERS
from tests.support.harness import ROOT, env_for, make_settings

ANSI = "\x1b["
BAR = "━"


@pytest.fixture(params=SERVER_BROKERS)
def settings(request, clean_env, redis_url, database_url):
    return make_settings(request.param, redis_url, database_url)


def _env(settings, **extra) -> dict[str, str]:
    env = env_for(settings, **extra)
    for name in ("FORCE_COLOR", "NO_COLOR", "TTY_COMPATIBLE", "TTY_INTERACTIVE", "COLUMNS", "LINES"):
        env.pop(name, None)
    env["TERM"] = "xterm-256color"
    return env


def piped(env, *args, stdin: Path | None = None) -> subprocess.CompletedProcess:
    with open(stdin or os.devnull, "rb") as source:
        return subprocess.run(
            [sys.executable, "-m", "conveyor", *args],
            env=env,
            cwd=ROOT,
            stdin=source,
            capture_output=True,
            text=True,
            timeout=300,
        )


def in_terminal(env, *args, stdin: Path | None = None) -> tuple[int, str]:
    """Run with stdout and stderr on a pseudo-terminal 120 columns wide; return (exit code, what it showed)."""
    leader, follower = pty.openpty()
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 120, 0, 0))
    with open(stdin or os.devnull, "rb") as source:
        child = subprocess.Popen(
            [sys.executable, "-m", "conveyor", *args],
            env=env,
            cwd=ROOT,
            stdin=source,
            stdout=follower,
            stderr=follower,
            close_fds=True,
        )
    os.close(follower)
    shown = bytearray()
    try:
        while True:
            try:
                chunk = os.read(leader, 65536)
            except OSError:  # EIO: every holder of the terminal has closed it
                break
            if not chunk:
                break
            shown += chunk
    finally:
        os.close(leader)
        code = child.wait(timeout=300)
    return code, shown.decode(errors="replace")


def _jobs_file(path: Path, prefix: str, lines: int, duplicates: int) -> Path:
    """``lines`` consume jobs; the last ``duplicates`` repeat keys seen earlier in the file."""
    unique = lines - duplicates
    with path.open("w") as out:
        for i in range(lines):
            n = i % unique
            out.write(
                json.dumps(
                    {
                        "job": "credit.consume",
                        "key": f"credit:{prefix}:{n}",
                        "payload": {"user_id": "u", "task_id": prefix, "message_id": str(n), "total_tokens": 1},
                    }
                )
                + "\n"
            )
    return path


def _summaries(text: str) -> list[dict]:
    found = []
    for line in text.splitlines():
        try:
            row = json.loads(line)
        except ValueError:
            continue
        if isinstance(row, dict) and "command" in row:
            found.append(row)
    return found


def test_batch_enqueue_through_pipes_prints_ids_and_one_json_summary(settings, tmp_path):
    jobs = _jobs_file(tmp_path / "jobs.jsonl", "piped", 3000, 100)
    result = piped(_env(settings), "enqueue", "--batch", "--chunk-size", "400", stdin=jobs)

    assert result.returncode == 0, result.stderr
    rows = [json.loads(line) for line in result.stdout.splitlines()]
    assert len(rows) == 3000 and all(set(r) == {"id", "deduplicated"} for r in rows)
    assert sum(r["deduplicated"] for r in rows) == 100
    summary = _summaries(result.stderr)
    assert len(summary) == 1
    assert summary[0] | {"seconds": 0} == {
        "command": "enqueue --batch",
        "ok": True,
        "jobs": 3000,
        "enqueued": 2900,
        "deduplicated": 100,
        "seconds": 0,
    }
    assert ANSI not in result.stdout + result.stderr and BAR not in result.stderr


def test_batch_enqueue_on_a_terminal_shows_a_bar_and_a_sentence(settings, tmp_path):
    jobs = _jobs_file(tmp_path / "jobs.jsonl", "tty", 3000, 100)
    code, shown = in_terminal(_env(settings), "enqueue", "--batch", "--chunk-size", "400", stdin=jobs)

    assert code == 0, shown
    assert ANSI in shown and BAR in shown
    assert "enqueueing" in shown and "3000/3000" in shown
    assert "3000 jobs: 2900 enqueued, 100 deduplicated in " in shown
    # No JSON: neither the 3000 id lines nor the summary object.
    assert '"deduplicated"' not in shown and not _summaries(shown)


def test_a_bad_line_anywhere_stops_the_batch_before_anything_is_sent(settings, tmp_path):
    jobs = _jobs_file(tmp_path / "jobs.jsonl", "bad", 2000, 0)
    lines = jobs.read_text().splitlines()
    lines[1499] = json.dumps({"job": "credit.consume", "payload": {"user_id": "u", "secret-ish": "s3cr3t"}})
    jobs.write_text("\n".join(lines) + "\n")
    env = _env(settings)

    result = piped(env, "enqueue", "--batch", "--chunk-size", "100", stdin=jobs)
    assert result.returncode == 2
    assert "line 1500: invalid payload for job 'credit.consume'" in result.stderr
    assert "task_id" in result.stderr and "s3cr3t" not in result.stderr and "Traceback" not in result.stderr
    assert result.stdout == ""
    status = json.loads(piped(env, "status", "--json").stdout)
    assert sum(q["waiting"] + q["delayed"] for q in status) == 0


@pytest.fixture
def empty_database(make_database) -> str:
    return make_database()


def test_migrate_through_pipes_prints_one_json_line(clean_env, redis_url, empty_database):
    env = _env(make_settings("postgres", redis_url, empty_database))
    names = [path.name for path in migration_files([platform])]  # conveyor migrate: the platform is in by default

    first = piped(env, "migrate")
    assert first.returncode == 0, first.stderr
    assert [json.loads(line) | {"seconds": 0} for line in first.stdout.splitlines()] == [
        {"command": "migrate", "ok": True, "applied": names, "seconds": 0}
    ]
    again = piped(env, "migrate")
    assert json.loads(again.stdout)["applied"] == []
    assert ANSI not in first.stdout + first.stderr and BAR not in first.stderr


def test_migrate_on_a_terminal_shows_a_bar_and_a_sentence(clean_env, redis_url, empty_database):
    env = _env(make_settings("postgres", redis_url, empty_database))
    names = [path.name for path in migration_files([platform])]  # conveyor migrate: the platform is in by default

    code, shown = in_terminal(env, "migrate")
    assert code == 0, shown
    assert ANSI in shown and BAR in shown and f"{len(names)}/{len(names)}" in shown
    assert f"applied {len(names)} migration(s): {', '.join(names)} in " in shown.replace("\r\n", " ")
    assert not _summaries(shown)
