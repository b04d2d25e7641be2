"""OpenTelemetry (issue 22, item 5): one trace from an HTTP request through the jobs it causes.

A client span calls the API (traceparent header) -> the route enqueues trace.parent -> a real worker runs it
-> it enqueues trace.child (fails once, retried, completes) and trace.doomed (fails for good). Every span is in
the client's trace, each under the span that caused it, on the Redis and the Postgres broker. Spans go to the
SDK's in-memory exporter, set as the process's tracer provider (conveyor keeps a provider it finds). And the
platform's own chain: a chat run POSTed over HTTP, its finalize and its charge (credit.consume), one trace.
"""

from __future__ import annotations

import asyncio
import logging

import httpx
import pytest
from opentelemetry import propagate, trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from conveyor import logs
from conveyor.api.app import create_app
from conveyor.app import App
from conveyor.platform.settings import PlatformSettings
from conveyor.settings import Settings
from tests.support.obs_support import broker_app, running
from tests.support.platform_support import make_task, serve, user_key
from tests.support.platform_support import workers as platform_workers
from tests.support.waiting import wait_for

EXPORTER = InMemorySpanExporter()


@pytest.fixture(scope="module", autouse=True)
def provider():
    sdk = None
    if isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider):
        sdk = TracerProvider()
        sdk.add_span_processor(SimpleSpanProcessor(EXPORTER))
        trace.set_tracer_provider(sdk)
    yield
    # A process's provider cannot be unset: later tests' spans (FastAPI traces every request once one is set)
    # go nowhere, and log lines carry no ids, as in a process without tracing.
    if sdk is not None:
        sdk.shutdown()
    logs.trace_fields = None


@pytest.fixture
def traced_app(request) -> App:
    EXPORTER.clear()
    app = broker_app(request, request.param, imports="tests.support.trace_jobs", otel=True)
    yield app
    app.close()


async def call(api, path: str, headers: dict[str, str]) -> httpx.Response:
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=api), base_url="http://conveyor") as http:
        return await http.get(path, headers=headers)


def ancestors(span: ReadableSpan, spans) -> list[int]:
    by_id = {s.context.span_id: s for s in spans}
    out = []
    while span.parent is not None and span.parent.span_id in by_id:
        span = by_id[span.parent.span_id]
        out.append(span.context.span_id)
    return out


def spans_named(name: str) -> list[ReadableSpan]:
    return [s for s in EXPORTER.get_finished_spans() if s.name == name]


def parent_of(span: ReadableSpan) -> int | None:
    return span.parent.span_id if span.parent else None


@pytest.mark.parametrize("traced_app", ["redis", "postgres"], indirect=True)
def test_a_request_and_every_job_it_causes_are_one_trace(traced_app, caplog):
    api = create_app(traced_app)

    @api.get("/trace-test")
    def enqueue() -> dict[str, str]:
        return {"id": traced_app.jobs.enqueue("trace.parent", {"n": 1}).id}

    tracer = trace.get_tracer("the-client")
    caplog.set_level(logging.INFO, logger="conveyor.events")
    with tracer.start_as_current_span("client call") as client:
        headers: dict[str, str] = {}
        propagate.inject(headers)
        response = asyncio.run(call(api, "/trace-test", headers))
    assert response.status_code == 200
    trace_id = client.get_span_context().trace_id

    with running(traced_app):
        wait_for(lambda: len(spans_named("run trace.child")) == 2, message="trace.child's two runs")
        wait_for(lambda: spans_named("failed trace.doomed"), message="trace.doomed's final failure")

    spans = EXPORTER.get_finished_spans()
    assert {s.context.trace_id for s in spans} == {trace_id}, "a span outside the client's trace"

    (server,) = [s for s in spans if s.kind == SpanKind.SERVER]  # FastAPI's own request span
    assert server.name == "GET /trace-test" and parent_of(server) == client.get_span_context().span_id
    assert server.attributes["http.response.status_code"] == 200

    (enqueue_parent,) = spans_named("enqueue trace.parent")
    assert enqueue_parent.kind == SpanKind.PRODUCER and server.context.span_id in ancestors(enqueue_parent, spans)
    (run_parent,) = spans_named("run trace.parent")
    assert run_parent.kind == SpanKind.CONSUMER and parent_of(run_parent) == enqueue_parent.context.span_id
    job_id = response.json()["id"]
    assert run_parent.attributes["conveyor.job_id"] == job_id
    assert run_parent.attributes["conveyor.queue"] == "indexing" and run_parent.attributes["conveyor.attempt"] == 1
    assert run_parent.attributes["conveyor.job"] == "trace.parent" and run_parent.attributes["conveyor.group"]

    # The child: enqueued inside the parent's run; attempt 1 fails and is retried, attempt 2 completes.
    (enqueue_child,) = spans_named("enqueue trace.child")
    assert parent_of(enqueue_child) == run_parent.context.span_id
    runs = sorted(spans_named("run trace.child"), key=lambda s: s.attributes["conveyor.attempt"])
    assert [r.attributes["conveyor.attempt"] for r in runs] == [1, 2]
    assert all(parent_of(r) == enqueue_child.context.span_id for r in runs)
    assert runs[0].status.status_code == StatusCode.ERROR and runs[1].status.status_code != StatusCode.ERROR
    (retry,) = spans_named("retry trace.child")
    assert parent_of(retry) == runs[0].context.span_id

    # The doomed job: two failed runs, one retry between them, and its final failure under the last run.
    doomed_runs = sorted(spans_named("run trace.doomed"), key=lambda s: s.attributes["conveyor.attempt"])
    assert [r.attributes["conveyor.attempt"] for r in doomed_runs] == [1, 2]
    (failed,) = spans_named("failed trace.doomed")
    assert parent_of(failed) == doomed_runs[1].context.span_id and failed.status.status_code == StatusCode.ERROR

    # Log lines written inside a run carry its trace and span ids.
    active = [
        r.args[0].fields
        for r in caplog.records
        if r.args and hasattr(r.args[0], "fields") and r.args[0].fields.get("event") == "active"
    ]
    parent_line = next(f for f in active if f["job"] == "trace.parent")
    assert parent_line["trace_id"] == format(trace_id, "032x")
    assert parent_line["span_id"] == format(run_parent.context.span_id, "016x")


def test_off_by_default_and_no_sdk_import(tmp_path):
    """Unconfigured, the App adds no tracing middleware and the API no request spans: nothing is imported."""
    import subprocess
    import sys

    code = (
        "import sys\n"
        "from conveyor.app import App\n"
        "from conveyor.api.app import create_app\n"
        "from conveyor.settings import Settings\n"
        "app = App(Settings(broker='inline', platform=False))\n"
        "create_app(app); app.broker\n"
        "names = [type(m).__name__ for m in app.broker.middleware]\n"
        "assert 'Tracing' not in names, names\n"
        "bad = [m for m in sys.modules if m.startswith(('opentelemetry.sdk', 'conveyor.middleware.tracing'))]\n"
        "assert not bad, bad\n"
    )
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "CONVEYOR_DATA_DIR": str(tmp_path)}
    result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr[-2000:]


@pytest.mark.parametrize("broker", ["redis", "postgres"])
def test_a_chat_round_its_finalize_and_its_charge_are_one_trace(broker, request, database_url):
    """The platform's chain: POST a run -> chat.run -> run.finalize -> credit.consume, in the caller's trace."""
    EXPORTER.clear()
    app = App(
        Settings(
            broker=broker,
            redis_url=request.getfixturevalue("redis_url") if broker == "redis" else None,
            database_url=database_url,
            otel=True,
        ),
        blueprint_settings=[PlatformSettings(local_chunk_delay=0)],
    )
    try:
        make_task(app, "t1", user_id="alice")
        tracer = trace.get_tracer("the-client")
        with platform_workers(app), serve(app) as base, tracer.start_as_current_span("client call") as client:
            headers = {**user_key(app, "alice")}
            propagate.inject(headers)
            response = httpx.post(f"{base}/api/tasks/t1/runs", json={"content": "hello"}, headers=headers, timeout=30)
            assert response.status_code == 202, response.text
            wait_for(lambda: spans_named("run credit.consume"), timeout=60, message="the round's charge to run")
    finally:
        app.close()
    spans = EXPORTER.get_finished_spans()
    trace_id = client.get_span_context().trace_id
    chain = {name: spans_named(name) for name in ("run chat.run", "run run.finalize", "run credit.consume")}
    assert all(len(found) == 1 for found in chain.values()), {k: len(v) for k, v in chain.items()}
    (server,) = [s for s in spans if s.kind == SpanKind.SERVER and s.name.startswith("POST")]
    assert parent_of(server) == client.get_span_context().span_id
    run_chat, run_finalize, run_charge = (found[0] for found in chain.values())
    for span in (server, run_chat, run_finalize, run_charge):
        assert span.context.trace_id == trace_id, span.name
    assert server.context.span_id in ancestors(run_chat, spans)
    assert run_chat.context.span_id in ancestors(run_finalize, spans)
    assert run_finalize.context.span_id in ancestors(run_charge, spans)
    assert run_charge.attributes["conveyor.queue"] == "critical" and run_charge.attributes["conveyor.attempt"] == 1


@pytest.mark.parametrize("traced_app", ["redis"], indirect=True)
def test_no_span_carries_a_secret_value(traced_app):
    secret = "sk-live-TRACE-SECRET-51c2"
    traced_app.jobs.enqueue("trace.leak", {"api_key": secret})
    with running(traced_app):
        wait_for(lambda: spans_named("failed trace.leak"), message="trace.leak's final failure")
    spans = EXPORTER.get_finished_spans()
    (run,) = spans_named("run trace.leak")
    assert run.status.status_code == StatusCode.ERROR and "provider refused key" in run.status.description
    for span in spans:
        assert secret not in span.to_json(), span.name
