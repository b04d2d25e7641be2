"""Agent runs are async jobs (issue 21.7), on Redis and Postgres, in a real ``conveyor worker`` process talking to a
real local model server (the OpenAI-compatible provider over HTTP).

50 rounds at the agent queue's concurrency of 50, each waiting on a model that thinks for DELAY seconds before it
answers, finish in about DELAY (not 50 x DELAY) and the process holds no thread per waiting run: its threads stay
well under the 50 a thread-per-run worker needs. A run stalled on its model still stops: a cancel ends it
``cancelled`` within about the cancel grace, and the queue's time limit fails it, each with its stream ended.

Red with the sync provider and sync jobs (before issue 21.7 reached the platform): 62 / 75 threads idle on
Redis / Postgres, so the thread check fails; and a run blocked in a sync socket read could be neither
cancelled within 30 s nor stopped by a 3 s time limit within 60 s (the interrupt waits for the read).
"""

from __future__ import annotations

import time

import psutil
import pytest

from conveyor.inspector import Inspector
from conveyor.platform import records
from conveyor.platform.payloads import run_key
from conveyor.platform.rounds import cancel_round, start_round
from conveyor.platform.streams import buffer_for
from tests.support.brokers import SERVER_BROKERS
from tests.support.chat_server import ChatServer
from tests.support.harness import make_settings
from tests.support.platform_support import make_task, run_status
from tests.support.waiting import wait_for

ROUNDS = 50
#: Seconds the model thinks before it answers each request.
DELAY = 1.0
REPLY = "the plan is to migrate the invoices table on friday after the backup"
#: A model that never answers within a test.
STALLED = 120.0


@pytest.fixture(params=SERVER_BROKERS)
def settings(request, clean_env, redis_url, database_url):
    # A short grace: a run that does not stop by itself after a cancel is interrupted this soon after it.
    # The platform's jobs only (no test jobs): the agent queue is all async, as in production.
    return make_settings(request.param, redis_url, database_url, cancel_grace_seconds=0.5, imports="")


def model_env(server: ChatServer, **extra: str) -> dict[str, str]:
    """The worker's settings for the HTTP provider on ``server``."""
    return dict(
        CONVEYOR_PROVIDER="openai",
        CONVEYOR_OPENAI_BASE_URL=server.base_url,
        CONVEYOR_OPENAI_API_KEY="sk-test-async-runs",
        CONVEYOR_OPENAI_MODEL="tiny",
        **extra,
    )


def worker_pid(worker) -> int:
    return wait_for(lambda: worker.child_pids() and worker.child_pids()[0], timeout=60, message="the worker to start")


def statuses(app, run_ids: list[str]) -> dict[str, int]:
    with app.pool.connection() as conn:
        rows = conn.execute(
            "SELECT status, count(*) FROM runs WHERE id = ANY(%s) GROUP BY status", (run_ids,)
        ).fetchall()
    return dict(rows)


def test_fifty_runs_waiting_on_the_model_share_a_few_threads_and_finish_in_about_one_delay(app, workers):
    with ChatServer([], delay=DELAY, reply=REPLY) as model:
        worker = workers("agent", **model_env(model, CONVEYOR_QUEUES__AGENT__CONCURRENCY=str(ROUNDS)))
        process = psutil.Process(worker_pid(worker))
        for i in range(ROUNDS):
            make_task(app, f"t{i}", user_id=f"u{i}", kind="chat")
        # All 50 wait on the paused queue, then go at once: the time is the worker's, not the enqueues'.
        Inspector(app).pause("agent")
        run_ids = [
            start_round(app, task_id=f"t{i}", content=f"round {i}: plan the migration").run_id for i in range(ROUNDS)
        ]
        idle = process.num_threads()
        started = time.monotonic()
        Inspector(app).resume("agent")
        peak = idle
        while statuses(app, run_ids).get("completed", 0) < ROUNDS:
            peak = max(peak, process.num_threads())
            assert time.monotonic() - started < 60, statuses(app, run_ids)
            time.sleep(0.02)
        took = time.monotonic() - started

    print(
        f"\n[{app.settings.broker_name}] {ROUNDS} rounds, model delay {DELAY:g} s, concurrency {ROUNDS}: {took:.2f} s "
        f"since the resume, {started + took - model.requests[0]['at']:.2f} s from the first model request to the last "
        f"reply stored; "
        f"worker threads {idle} idle, {peak} at most (+{peak - idle}); model requests in flight at most "
        f"{model.peak_in_flight}"
    )
    assert len(model.requests) == ROUNDS
    # The runs waited on the model together, not one after another (50 x 1 s).
    assert model.peak_in_flight >= ROUNDS * 0.8, model.peak_in_flight
    assert took < ROUNDS * DELAY / 4, took
    # No thread per waiting run: a worker that held one would have 50 for the runs alone (seen: 16 idle and 29
    # at most on Redis, 29 and 38 on Postgres, whose pools and listener have threads of their own).
    assert peak < ROUNDS and peak - idle <= 25, (idle, peak)
    with app.pool.connection() as conn:
        reply = records.get_message(conn, run_status(app, run_ids[0]).assistant_message_id).content
    assert reply == REPLY
    assert [e.kind for e in buffer_for(app).read_all(run_ids[-1])][-1] == "end"


def test_a_run_stalled_on_its_model_is_cancelled_within_about_its_grace(app, workers):
    with ChatServer([], delay=STALLED) as model:
        workers("agent", **model_env(model))
        make_task(app, "stuck", user_id="alice", kind="chat")
        run_id = start_round(app, task_id="stuck", content="are you there?").run_id
        wait_for(lambda: model.in_flight == 1, timeout=60, message="the run to wait on the model")
        asked = time.monotonic()
        cancel_round(app, run_status(app, run_id))
        wait_for(lambda: run_status(app, run_id).status == "cancelled", timeout=30, message="the run cancelled")
        ended = wait_for(
            lambda: (e := buffer_for(app).read_all(run_id)) and e[-1].kind == "end" and e[-1],
            timeout=30,
            message="its stream to end",
        )
        took = time.monotonic() - asked
        # Its job ends cancelled too (not failed): the coroutine was interrupted at its await.
        wait_for(
            lambda: [v.state for v in Inspector(app).search(run_key(run_id))] == ["cancelled"],
            timeout=30,
            message="its job cancelled",
        )
    print(f"\n[{app.settings.broker_name}] a run stalled on its model: cancelled in {took:.2f} s (grace 0.5 s)")
    assert ended.data == "cancelled"
    assert took < 5, took


def test_a_run_stalled_on_its_model_fails_at_the_queue_s_time_limit(app, workers):
    with ChatServer([], delay=STALLED) as model:
        worker = workers(
            "agent",
            **model_env(model, CONVEYOR_QUEUES__AGENT__TIME_LIMIT="3", CONVEYOR_QUEUES__AGENT__MAX_ATTEMPTS="1"),
        )
        worker_pid(worker)
        make_task(app, "slow", user_id="bob", kind="chat")
        started = time.monotonic()
        run_id = start_round(app, task_id="slow", content="take your time").run_id
        run = wait_for(
            lambda: (r := run_status(app, run_id)).status == "failed" and r, timeout=60, message="the run to fail"
        )
        took = time.monotonic() - started
        ended = wait_for(
            lambda: (e := buffer_for(app).read_all(run_id)) and e[-1].kind == "end" and e[-1],
            timeout=30,
            message="its stream to end",
        )
    print(f"\n[{app.settings.broker_name}] a run stalled on its model: failed at its 3 s time limit in {took:.2f} s")
    assert len(model.requests) == 1, "it was waiting on the model when its limit came"
    assert ended.data == "failed"
    assert "TimeLimitExceeded" in (run.error or ""), run.error
    assert took < 15, took  # its 3 s limit, then the cancel grace at most
