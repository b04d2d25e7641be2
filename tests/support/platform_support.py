"""Helpers for the agent-platform tests: workers in this process, a real HTTP server for the API."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from dramatiq import Worker

from conveyor import access
from conveyor.platform import records
from tests.support.harness import ROOT
from tests.support.obs_support import api_server

#: The queues a round's jobs run on.
ROUND_QUEUES = ("agent", "critical", "llm", "indexing")


@contextlib.contextmanager
def workers(app, queues=ROUND_QUEUES, threads: int = 4) -> Iterator[Worker]:
    """One Dramatiq worker in this process consuming ``queues`` of ``app``'s broker."""
    app.broker.emit_after("process_boot")
    worker = Worker(app.broker, queues=set(queues), worker_threads=threads, worker_timeout=100)
    worker.start()
    try:
        yield worker
    finally:
        worker.stop(timeout=10_000)


#: The whole API (``create_app``) on a real uvicorn server; yields its base URL.
serve = api_server


def make_task(
    app, task_id: str, *, user_id: str = "u1", kind: str = "chat", title: str = "", instructions: str = ""
) -> records.Task:
    with app.pool.connection() as conn:
        return records.create_task(conn, id=task_id, user_id=user_id, kind=kind, title=title, instructions=instructions)


def user_key(app, user_id: str) -> dict[str, str]:
    """Headers carrying a new API key of ``user_id`` (the user is created if need be)."""
    with app.pool.connection() as conn:
        access.create_user(conn, user_id)
        _, key = access.create_api_key(conn, user_id)
    return {"Authorization": f"Bearer {key}"}


def run_status(app, run_id: str) -> records.Run:
    with app.pool.connection() as conn:
        return records.get_run(conn, run_id)


def parse_sse(lines) -> Iterator[dict]:
    """Events of an SSE body (an iterable of lines): {"id", "event", "data"}; comments skipped."""
    event: dict = {}
    for line in lines:
        if line == "":
            if "data" in event or "event" in event:
                yield event
            event = {}
        elif line.startswith(":"):
            continue
        else:
            name, _, value = line.partition(":")
            event[name] = value[1:] if value.startswith(" ") else value


def completed_round(app, *, task_id: str, user_id: str, question: str, answer: str) -> str:
    """A task with one finished round, written straight to the records; returns the assistant message id."""
    make_task(app, task_id, user_id=user_id)
    with app.pool.connection() as conn:
        records.add_message(conn, id=f"{task_id}-q", task_id=task_id, role="user", content=question)
        records.create_run(
            conn,
            id=f"{task_id}-run",
            task_id=task_id,
            job="chat.run",
            user_message_id=f"{task_id}-q",
            assistant_message_id=f"{task_id}-a",
        )
        run = records.get_run(conn, f"{task_id}-run")
        records.complete_run(conn, run, content=answer, prompt_tokens=10, completion_tokens=20)
    return f"{task_id}-a"


def worker_process(env: dict, queue: str, threads: int | None = None):
    """A real worker process for one queue (``conveyor.app.run_worker_process``), configured by ``env``."""
    import subprocess
    import sys

    code = f"from conveyor.app import run_worker_process; run_worker_process({queue!r}, {threads!r})"
    env = {**env, "PYTHONPATH": str(ROOT)}
    return subprocess.Popen(
        [sys.executable, "-c", code], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
    )


def stop_process(proc, timeout: float = 30) -> str:
    """SIGTERM a worker process, wait for it, return its stderr."""
    import subprocess

    if proc.poll() is None:
        proc.terminate()
    try:
        _, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        _, err = proc.communicate()
    return err or ""
