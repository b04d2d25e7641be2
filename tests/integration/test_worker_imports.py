"""A worker process holds only what running jobs needs: the heavy libraries of the other sides stay out.

Each module a process imports stays in its memory for good (code objects, classes, C extensions):
httpx with the command line it drags in (click, rich, pygments) was ~8 MiB of every worker process,
cryptography ~7 MiB, psycopg ~10 MiB on the Redis broker (docs/bench.md, "Memory"). They are imported
where they are used: the webhook sender's thread, a secret box, a job's database connection.

The process here is ``conveyor worker``'s child as it runs (:func:`conveyor.app.run_worker_process`,
the platform loaded as by default, a job run through it), so what it imports at start-up, on its
first job and in its maintenance loop counts.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

#: Never imported by a worker process, whichever the broker: the HTTP side, the command line's
#: terminal output, the webhook's HTTP client, the secrets' cipher, tracing's SDK.
NEVER_IN_A_WORKER = (
    "fastapi",
    "starlette",
    "uvicorn",
    "httpx",
    "rich",
    "pygments",
    "click",
    "cryptography.fernet",
    "conveyor.api",
    "conveyor.cli",
    "conveyor.middleware.tracing",
    "opentelemetry.sdk.trace",
)

#: Also absent on the Redis broker, whose jobs (this one) never open the database.
NEVER_IN_A_REDIS_WORKER = ("psycopg", "psycopg_pool", "conveyor.db")

JOB_MODULE = """
import threading

from conveyor import Jobs, Payload, Queue

jobs = Jobs()
PROBE = Queue("imports_probe", concurrency=2)
ran = threading.Event()


class Empty(Payload):
    pass


@jobs.job("imports.probe", queue=PROBE, payload=Empty)
def probe(payload, ctx):
    ran.set()
"""

#: Runs the worker child's entry point; a thread enqueues one job, waits for it, reports the modules
#: the process holds, and stops it with SIGTERM as the supervisor does.
PROCESS = """
import os, signal, sys, threading, time
import imports_probe_jobs as probe_jobs
from conveyor.app import run_worker_process

def report():
    deadline = time.monotonic() + 30
    while probe_jobs.jobs.app is None and time.monotonic() < deadline:
        time.sleep(0.05)
    probe_jobs.probe.enqueue({{}})
    if not probe_jobs.ran.wait(30):
        print("job never ran", file=sys.stderr)
    time.sleep(0.5)  # the ack and the after-hooks (webhook, metrics, events) too
    held = sorted(name for name in {names!r} if name in sys.modules)
    print("held:" + ",".join(held), flush=True)
    os.kill(os.getpid(), signal.SIGTERM)

threading.Thread(target=report, daemon=True).start()
run_worker_process("imports_probe")
"""


@pytest.mark.parametrize("broker", ["redis", "postgres"])
def test_a_worker_process_never_imports_the_other_sides_libraries(broker, request, database_url, tmp_path):
    (tmp_path / "imports_probe_jobs.py").write_text(JOB_MODULE)
    names = NEVER_IN_A_WORKER + (NEVER_IN_A_REDIS_WORKER if broker == "redis" else ())
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(tmp_path),
        "PYTHONPATH": str(tmp_path),
        "CONVEYOR_DATA_DIR": str(tmp_path),
        "CONVEYOR_BROKER": broker,
        "DATABASE_URL": database_url,
        "CONVEYOR_IMPORTS": "imports_probe_jobs",
        # Every failure of this job would go to a receiver: the sender is built, its client must not be.
        "JOB_FAILURE_WEBHOOK_URL": "http://127.0.0.1:9/hook",
    }
    if broker == "redis":
        env["REDIS_URL"] = request.getfixturevalue("redis_url")
    code = textwrap.dedent(PROCESS.format(names=names))
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=90)
    held = [line for line in done.stdout.splitlines() if line.startswith("held:")]
    assert held, f"no report (exit {done.returncode}): {done.stderr[-3000:]}"
    assert held[-1] == "held:", f"a worker process imported {held[-1][5:]}"
    assert done.returncode == 0, done.stderr[-3000:]
