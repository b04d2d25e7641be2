"""The platform across real worker processes: the llm queue's fleet-wide cap, and a run whose
worker is SIGKILLed mid-stream finished by another worker without a gap or a duplicate."""

from __future__ import annotations

import json
import os
import signal

import httpx
import pytest

from conveyor.app import App
from conveyor.platform.providers.base import ChatMessage
from conveyor.platform.providers.local import reply_chunks
from conveyor.platform.rounds import start_round
from conveyor.platform.streams import buffer_for
from conveyor.settings import Settings
from tests.support.brokers import SERVER_BROKERS
from tests.support.platform_support import (
    completed_round,
    make_task,
    parse_sse,
    run_status,
    serve,
    stop_process,
    user_key,
    worker_process,
)
from tests.support.waiting import wait_for

PEAK_SQL = """
SELECT max((SELECT count(*) FROM memory_extractions o
            WHERE o.started_at <= e.started_at AND o.finished_at > e.started_at))
FROM memory_extractions e
"""


def _env(clean_env, broker, redis_url, database_url, **extra) -> dict:
    clean_env.setenv("CONVEYOR_BROKER", broker)
    clean_env.setenv("REDIS_URL", redis_url)
    clean_env.setenv("DATABASE_URL", database_url)
    clean_env.setenv("CONVEYOR_LOG_LEVEL", "WARNING")
    for name, value in extra.items():
        clean_env.setenv(f"CONVEYOR_{name.upper()}", str(value))
    return dict(os.environ)


@pytest.mark.parametrize("broker", SERVER_BROKERS)
def test_llm_jobs_never_exceed_the_global_cap_across_three_worker_processes(clean_env, broker, redis_url, database_url):
    cap, jobs = 2, 8
    env = _env(
        clean_env,
        broker,
        redis_url,
        database_url,
        llm_global_concurrency=cap,
        local_chunk_delay=0.04,
        queues__llm__concurrency=2,
    )
    app = App(Settings(broker=broker, redis_url=redis_url, database_url=database_url))
    for n in range(jobs):
        message_id = completed_round(
            app,
            task_id=f"t{n}",
            user_id=f"u{n}",
            question=f"notes about topic{n}",
            answer=f"topic{n}: kept in a notebook",
        )
        app.jobs.enqueue("memory.extraction", {"user_id": f"u{n}", "task_id": f"t{n}", "message_id": message_id})

    procs = [worker_process(env, "llm") for _ in range(3)]  # 3 x 2 threads: 6 could run at once
    try:

        def extracted():
            with app.pool.connection() as conn:
                return conn.execute("SELECT count(*) FROM memory_extractions").fetchone()[0] == jobs

        wait_for(extracted, timeout=90, message="every extraction")
    finally:
        for proc in procs:  # all drain at once, then each is waited for
            proc.terminate()
        errors = [stop_process(p) for p in procs]

    with app.pool.connection() as conn:
        peak = conn.execute(PEAK_SQL).fetchone()[0]
        memories = conn.execute("SELECT count(*) FROM memories").fetchone()[0]
    assert peak == cap, f"peak {peak} running at once, cap {cap}"
    assert memories >= jobs
    assert app.broker.queue_counts("llm").failed_total == 0, errors
    app.close()


@pytest.mark.parametrize("broker", SERVER_BROKERS)
def test_a_run_whose_worker_is_killed_mid_stream_is_finished_by_another(clean_env, broker, redis_url, database_url):
    env = _env(
        clean_env,
        broker,
        redis_url,
        database_url,
        local_chunk_delay=0.08,
        heartbeat_timeout=2,
        maintenance_interval=0.3,
        pg_recovery_seconds=0.3,
        pg_lease_seconds=2,  # Postgres's counterpart of heartbeat_timeout (the default 15 s lease)
    )
    app = App(Settings(broker=broker, redis_url=redis_url, database_url=database_url))
    make_task(app, "t1", user_id="frank")
    content = "Draft the incident review for the outage on tuesday"
    expected = reply_chunks([ChatMessage("user", content)])

    first = worker_process(env, "agent")
    second = None
    try:
        started = start_round(app, task_id="t1", content=content)
        buffer = buffer_for(app)
        with (
            serve(app) as base,
            httpx.Client(base_url=base, timeout=60, headers=user_key(app, "frank")) as client,
            client.stream("GET", f"/api/runs/{started.run_id}/stream") as response,
        ):
            events = parse_sse(response.iter_lines())
            seen = []
            for event in events:
                if event.get("event") != "chunk":
                    continue
                seen.append(event)
                if len(seen) == 5:
                    break
            os.kill(first.pid, signal.SIGKILL)
            first.wait(10)
            killed_at = len(buffer.read_all(started.run_id))
            assert killed_at < len(expected), "the run finished before its worker was killed"
            second = worker_process(env, "agent")
            for event in events:
                if "id" in event:
                    seen.append(event)
                if event.get("event") == "end":
                    break

        chunks = [e for e in seen if e["event"] == "chunk"]
        assert [int(e["id"]) for e in chunks] == list(range(1, len(expected) + 1))
        assert [json.loads(e["data"])["text"] for e in chunks] == expected
        assert seen[-1]["event"] == "end" and json.loads(seen[-1]["data"]) == {"status": "completed"}

        run = run_status(app, started.run_id)
        assert run.status == "completed" and run.attempts == 2
        with app.pool.connection() as conn:
            stored = conn.execute(
                "SELECT content FROM messages WHERE id = %s", (started.assistant_message_id,)
            ).fetchone()[0]
        assert stored == "".join(expected)
        assert [e.seq for e in buffer.read_all(started.run_id)] == list(range(1, len(expected) + 2))
    finally:
        if first.poll() is None:
            first.kill()
        stop_process(first)
        if second is not None:
            stop_process(second)
    app.close()
