"""A round end to end: POST a run, follow its SSE stream (disconnecting and resuming), and the
end-of-round jobs: one charge, memories, an index that search finds."""

from __future__ import annotations

import asyncio
from decimal import Decimal

import httpx
import pytest

from conveyor.app import App
from conveyor.ledger import credits
from conveyor.platform.payloads import MemoryExtraction, RunFinalize
from conveyor.platform.processors.finalize import finalize_run
from conveyor.platform.processors.memory import extract_memories
from conveyor.platform.providers.base import ChatMessage
from conveyor.platform.providers.local import reply_chunks
from conveyor.platform.settings import PlatformSettings
from conveyor.settings import Settings
from conveyor.tasks.context import JobContext
from tests.support.brokers import ALL_BROKERS
from tests.support.platform_support import make_task, parse_sse, run_status, serve, user_key, workers
from tests.support.waiting import wait_for

PRICE = Decimal("0.002")


@pytest.fixture(params=ALL_BROKERS)
def app(request, redis_url, database_url):
    app = App(
        Settings(
            broker=request.param,
            redis_url=redis_url,
            database_url=database_url,
        ),
        blueprint_settings=[PlatformSettings(local_chunk_delay=0.03)],
    )
    yield app
    app.close()


def _read_events(client: httpx.Client, url: str, *, headers=None, stop_after: int | None = None) -> list[dict]:
    """Events of one SSE connection; with ``stop_after``, hang up after that many chunks."""
    events = []
    with client.stream("GET", url, headers=headers or {}) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        for event in parse_sse(response.iter_lines()):
            if "id" not in event:
                continue  # the retry hint
            events.append(event)
            if event["event"] == "end" or (stop_after and len(events) >= stop_after):
                break
    return events


def _round_done(app, user_id: str, message_id: str):
    with app.pool.connection() as conn:
        charged = conn.execute("SELECT count(*) FROM credit_entries WHERE user_id = %s", (user_id,)).fetchone()[0]
        extracted = conn.execute(
            "SELECT memories FROM memory_extractions WHERE message_id = %s", (message_id,)
        ).fetchone()
        indexed = conn.execute(
            "SELECT indexed_version = version FROM resources WHERE id = %s", (f"reply:{message_id}",)
        ).fetchone()
    return charged == 1 and extracted and indexed and indexed[0]


def test_a_run_streams_to_a_client_that_disconnects_and_resumes(app):
    make_task(app, "t1", user_id="alice", title="Migration plan")
    with (
        workers(app),
        serve(app) as base,
        httpx.Client(base_url=base, timeout=30, headers=user_key(app, "alice")) as client,
    ):
        response = client.post("/api/tasks/t1/runs", json={"content": "Plan the postgres migration for friday"})
        assert response.status_code == 202, response.text
        accepted = response.json()
        assert accepted["stream_url"] == f"/api/runs/{accepted['run_id']}/stream"
        assert response.headers["location"] == f"/api/runs/{accepted['run_id']}"

        first = _read_events(client, accepted["stream_url"], stop_after=5)  # then the client hangs up
        assert run_status(app, accepted["run_id"]).status == "running"  # it left mid-stream
        rest = _read_events(client, accepted["stream_url"], headers={"Last-Event-ID": first[-1]["id"]})

        events = first + rest
        chunks = [e for e in events if e["event"] == "chunk"]
        seqs = [int(e["id"]) for e in chunks]
        assert seqs == list(range(1, len(seqs) + 1))  # complete, in order, nothing twice
        assert events[-1]["event"] == "end" and '"completed"' in events[-1]["data"]
        expected = reply_chunks([ChatMessage("user", "Plan the postgres migration for friday")])
        texts = [httpx.Response(200, content=e["data"]).json()["text"] for e in chunks]
        assert texts == expected

        status = client.get(accepted["status_url"]).json()
        assert status["status"] == "completed" and status["attempts"] == 1
        assert status["completion_tokens"] == len(expected)
        assert status["total_tokens"] == status["prompt_tokens"] + status["completion_tokens"]

        replay = _read_events(client, f"{accepted['stream_url']}?after=0")
        assert replay == events  # a finished stream replays whole

        wait_for(
            lambda: _round_done(app, "alice", accepted["assistant_message_id"]),
            timeout=60,
            message="the round's charge, memories and index",
        )
        with app.pool.connection() as conn:
            message = conn.execute(
                "SELECT role, content FROM messages WHERE id = %s", (accepted["assistant_message_id"],)
            ).fetchone()
            assert message == ("assistant", "".join(expected))
            assert credits.balance(conn, "alice") == -credits.cost(status["total_tokens"], PRICE)
            keys = {row[0] for row in conn.execute("SELECT key FROM memories WHERE user_id = 'alice'")}
        assert keys == {"plan", "postgres", "migration"}

        found = client.get("/api/resources/search", params={"q": "postgres migration"}).json()["results"]
        assert [hit["resource_id"] for hit in found] == [f"reply:{accepted['assistant_message_id']}"]
        assert found[0]["title"] == "Migration plan"


def test_finalize_twice_charges_once_and_enqueues_nothing_new(app):
    make_task(app, "t1", user_id="bob", kind="task", instructions="Summarise the week")
    with (
        workers(app),
        serve(app) as base,
        httpx.Client(base_url=base, timeout=30, headers=user_key(app, "bob")) as client,
    ):
        accepted = client.post("/api/tasks/t1/runs", json={"content": "weekly report about invoices"}).json()
        wait_for(
            lambda: _round_done(app, "bob", accepted["assistant_message_id"]),
            timeout=60,
            message="the round's charge, memories and index",
        )
        queues = ("critical", "llm", "indexing")
        # A job's outcome is in the database a moment before its ack (acks are batched): let the queues settle.
        wait_for(
            lambda: (
                all(app.broker.queue_counts(q).completed_total >= 1 for q in queues)
                and all(c.waiting + c.delayed + c.active == 0 for c in map(app.broker.queue_counts, queues))
            ),
            timeout=30,
            message="the round's jobs to be acked",
        )
        before = {q: app.broker.queue_counts(q).completed_total for q in queues}

        payload = RunFinalize(task_id="t1", run_id=accepted["run_id"])
        ctx = JobContext("run.finalize", "critical", "direct", 1, 3, app)
        assert finalize_run(payload, ctx) == {"enqueued": 0, "deduplicated": 3}
        for _ in range(2):  # duplicate deliveries through the broker, no key to stop them
            app.jobs.enqueue("run.finalize", payload)

        def settled():
            counts = [app.broker.queue_counts(q) for q in queues]
            return (
                all(c.waiting + c.delayed + c.active == 0 for c in counts)
                and counts[0].completed_total == before["critical"] + 2
            )

        wait_for(settled, timeout=30, message="the duplicate finalizes to run")

        after = {q: app.broker.queue_counts(q).completed_total for q in queues}
        assert after == {"critical": before["critical"] + 2, "llm": before["llm"], "indexing": before["indexing"]}
        with app.pool.connection() as conn:
            assert len(credits.entries(conn, "bob")) == 1
            assert credits.verify(conn) == []
        assert run_status(app, accepted["run_id"]).finalized_at is not None

        # The memory job delivered again (a paused worker resuming, a lost ack): its step is once-guarded,
        # so nothing is written again, however differently the model would answer the second time.
        (memory_job,) = app.broker.list_jobs("llm", "completed")
        with app.pool.connection() as conn:
            conn.execute("DELETE FROM memories WHERE user_id = 'bob'")
        again = JobContext("memory.extraction", "llm", memory_job.id, 2, 3, app)
        asyncio.run(extract_memories(MemoryExtraction.model_validate(memory_job.payload), again))
        with app.pool.connection() as conn:
            assert conn.execute("SELECT count(*) FROM memories WHERE user_id = 'bob'").fetchone()[0] == 0


def test_invalid_and_unknown_ids_get_clear_4xx(redis_url, database_url):
    app = App(Settings(broker="redis", redis_url=redis_url, database_url=database_url))
    make_task(app, "t1")
    with serve(app) as base, httpx.Client(base_url=base, timeout=30, headers=user_key(app, "u1")) as client:
        _check_4xx(client)
    app.close()


def _check_4xx(client: httpx.Client) -> None:
    assert client.post("/api/tasks/nope/runs", json={"content": "hi"}).status_code == 404
    assert client.post("/api/tasks/nope/runs", json={"content": "hi"}).json()["detail"] == "no such task"
    assert client.post("/api/tasks/bad id!/runs", json={"content": "hi"}).status_code == 422
    assert client.post("/api/tasks/t1/runs", json={"content": ""}).status_code == 422
    assert client.post("/api/tasks/t1/runs", json={}).status_code == 422
    assert client.get("/api/runs/run_missing").status_code == 404
    assert client.get("/api/runs/run_missing/stream").status_code == 404
    assert client.get("/api/runs/" + "x" * 200).status_code == 422

    accepted = client.post("/api/tasks/t1/runs", json={"content": "hi", "message_id": "m1"}).json()
    assert client.get(accepted["stream_url"], headers={"Last-Event-ID": "abc"}).status_code == 400
    again = client.post("/api/tasks/t1/runs", json={"content": "hi", "message_id": "m1"})
    assert again.status_code == 202 and again.json()["run_id"] == accepted["run_id"]
    assert again.json()["created"] is False and again.json()["job_id"] == accepted["job_id"]
    assert client.post("/api/tasks/t1/runs", json={"content": "other", "message_id": "m1"}).status_code == 409


def test_a_resource_is_indexed_once_per_version_and_found_by_search(app):
    body = {"user_id": "carol", "title": "Runbook", "body": "Rotate the kafka certificates every quarter. " * 60}
    with (
        workers(app),
        serve(app) as base,
        httpx.Client(base_url=base, timeout=30, headers=user_key(app, "carol")) as client,
    ):
        first = client.put("/api/resources/doc1", json=body)
        assert first.status_code == 202
        wait_for(lambda: client.get("/api/resources/doc1").json()["indexed"], timeout=30, message="indexing")
        again = client.put("/api/resources/doc1", json=body).json()
        assert again["version"] == first.json()["version"] and again["deduplicated"] is True

        hits = client.get("/api/resources/search", params={"q": "kafka certificates", "user_id": "carol"}).json()
        assert {h["resource_id"] for h in hits["results"]} == {"doc1"}
        assert len(hits["results"]) > 1  # long text: several chunks match
        assert "<b>" in hits["results"][0]["snippet"]
        assert client.get("/api/resources/search", params={"q": "kafka", "user_id": "dave"}).json()["results"] == []
        assert client.get("/api/resources/search", params={"q": ""}).status_code == 422

        changed = client.put("/api/resources/doc1", json={**body, "body": "Now about zookeeper only."}).json()
        assert changed["version"] != first.json()["version"] and changed["deduplicated"] is False
        wait_for(lambda: client.get("/api/resources/doc1").json()["indexed"], timeout=30, message="re-indexing")
        assert client.get("/api/resources/search", params={"q": "kafka"}).json()["results"] == []
        assert client.get("/api/resources/search", params={"q": "zookeeper"}).json()["results"]


def test_a_run_left_queued_without_its_job_is_enqueued_once_by_the_scheduler_pass(app):
    """A run whose enqueue never happened (its process died after the run's commit, or the outcome was
    unknown) is not left queued for good holding a quota place: the pass enqueues it, keyed, once."""
    from conveyor.platform import records
    from conveyor.platform.rounds import requeue_stranded_runs

    make_task(app, "t-stranded", user_id="u-stranded")
    with app.pool.connection() as conn:
        records.add_message(conn, id="m-stranded", task_id="t-stranded", role="user", content="hi")
        records.create_run(
            conn,
            id="run-stranded",
            task_id="t-stranded",
            job="chat.run",
            user_message_id="m-stranded",
            assistant_message_id="a-stranded",
        )
    assert requeue_stranded_runs(app, older_than=3600) == 0, "a young run is left to its own enqueue"
    assert requeue_stranded_runs(app, older_than=0) == 1
    assert requeue_stranded_runs(app, older_than=0) == 0, "the key makes the next pass a no-op"
    jobs = app.broker.list_jobs("agent", "waiting")
    assert [r.payload for r in jobs if r.job == "chat.run"] == [{"task_id": "t-stranded", "run_id": "run-stranded"}]
