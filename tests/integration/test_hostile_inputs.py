"""Every route of the real app, walked with hostile values: each answers a 4xx, with no traceback and no echo.

The routes are enumerated from ``create_app(...).routes`` (a new route is
walked without editing this file). For each one, with credentials that get
it past authentication (so the values reach validation):

- each path parameter gets a NUL, an oversize value and a path traversal;
- each declared query parameter gets a NUL, an oversize value and integer
  overflows (2^63, 1e32); any route gets a NUL in its query string;
- a route with a body gets a NUL in every field, an oversize body, a deeply
  nested body and integer overflows in every field;
- the SSE route gets hostile ``Last-Event-ID`` headers.

Every answer must be 4xx, carry no traceback, and not contain the hostile
value (the marker, or the overflowing number).
"""

from __future__ import annotations

import json
import subprocess
import sys
from urllib.parse import quote

import httpx
import pytest
from starlette.routing import Mount

from conveyor.api import create_app
from conveyor.app import App
from conveyor.settings import Settings
from tests.support.obs_support import TOKEN, cli_env
from tests.support.platform_support import make_task, serve, user_key

MARK = "zq9mark"
BODY_CAP = 256 * 1024
OVERFLOWS = ("9223372036854775808", "18446744073709551616", "1e32")
#: Body fields every route might read; each gets the hostile value.
FIELDS = (
    "content",
    "message_id",
    "user_id",
    "task_id",
    "title",
    "body",
    "kind",
    "cron",
    "job",
    "payload",
    "env",
    "timezone",
    "name",
    "misfire_policy",
    "build_id",
    "agent_id",
    "source_dir",
    "archive_path",
    "limit",
)
#: Valid stand-ins for the path parameters not under attack.
PLACEHOLDERS = {
    "task_id": "t1",
    "run_id": "run_none",
    "resource_id": "doc1",
    "queue": "indexing",
    "job_id": "job_none",
    "schedule_id": "sched_none",
    "build_id": "build_none",
    "target_kind": "agent",
    "target_id": "agent_none",
    "path": "dashboard.js",
}
#: Valid values of the query parameters not under attack (some are required).
QUERY_PLACEHOLDERS = {"queue": "indexing", "state": "failed", "q": "runbook"}


def _flat(dependant) -> tuple[list[str], list[str], bool]:
    """Path params, query params and whether a body is read, over the dependant and its dependencies."""
    params = [p.alias for p in dependant.path_params]
    queries = [(p.alias, _numeric(p.field_info.annotation)) for p in dependant.query_params]
    body = bool(dependant.body_params)
    for sub in dependant.dependencies:
        p, q, b = _flat(sub)
        params, queries, body = params + p, queries + q, body or b
    return sorted(set(params)), sorted(set(queries)), body


def _numeric(annotation) -> bool:
    """Whether a parameter holds a number (integer overflow is tried on those and on cursors)."""
    return annotation in (int, float) or any(a in (int, float) for a in getattr(annotation, "__args__", ()))


def every_route(api) -> list[tuple[str, str, list[str], list[str], bool]]:
    """(method, path, path params, query params, has a body) of every route, included routers flattened."""
    found = []

    def visit(route) -> None:
        if hasattr(route, "effective_candidates"):  # an included router (FastAPI >= 0.165)
            candidates = route.effective_candidates
            for inner in candidates() if callable(candidates) else candidates:
                visit(inner)
            return
        path = getattr(route, "path", None)
        if path is None:
            return
        dependant = getattr(route, "dependant", None)
        methods = sorted((getattr(route, "methods", None) or {"GET"}) - {"HEAD"})
        if dependant is not None:
            params, queries, has_body = _flat(dependant)
        elif isinstance(route, Mount):  # the dashboard's static files
            path, params, queries, has_body = path + "/{path}", ["path"], [], False
        else:  # a plain route (the OpenAPI document, the docs pages)
            params, queries, has_body = [], [], False
        for method in methods:
            found.append((method, path, params, queries, has_body))

    for route in api.routes:
        visit(route)
    return found


def _auth_for(path: str, admin: dict, user: dict) -> dict:
    return admin if path.startswith(("/api/admin", "/api/schedules", "/admin", "/api/deployments")) else user


def _url(path: str, values: dict[str, str]) -> str:
    for name, value in values.items():
        path = path.replace("{" + name + "}", value)
    return path


def cases(api) -> list[tuple[str, str, str, dict]]:
    """(id, method, url, request options) for every hostile request."""
    out = []
    for method, path, params, queries, has_body in every_route(api):
        base = {name: PLACEHOLDERS.get(name, "x1") for name in params}
        for name in params:
            for label, value in (
                ("nul", quote(f"{MARK}\x00x")),
                ("oversize", MARK * 100),
                ("traversal", quote(f"../../{MARK}/etc/passwd", safe="")),
                ("dotdot", "%2E%2E"),
            ):
                out.append((f"{method} {path} path:{name}={label}", method, _url(path, {**base, name: value}), {}))
        url = _url(path, base)
        out.append((f"{method} {path} query:nul", method, f"{url}?q={quote(MARK)}%00x", {}))
        valid = {name: QUERY_PLACEHOLDERS[name] for name, _ in queries if name in QUERY_PLACEHOLDERS}
        for name, numeric in queries:
            overflows = OVERFLOWS if numeric or name == "cursor" else ()
            for label, value in (
                ("nul", f"{MARK}\x00x"),
                ("oversize", MARK * 1000),
                *((f"overflow{v}", v) for v in overflows),
            ):
                out.append((f"{method} {path} query:{name}={label}", method, url, {"params": {**valid, name: value}}))
        if method in ("POST", "PUT", "PATCH"):
            nested = "[" * 100_000 + "]" * 100_000
            deep_object = json.dumps(_deep({"content": MARK}, 200))
            out.append((f"{method} {path} body:nul", method, url, {"json": {f: f"{MARK}\x00x" for f in FIELDS}}))
            out.append((f"{method} {path} body:deep-array", method, url, {"content": nested, "json_ct": True}))
            out.append((f"{method} {path} body:deep-object", method, url, {"content": deep_object, "json_ct": True}))
            out.append((f"{method} {path} body:oversize", method, url, {"json": {"content": MARK * (BODY_CAP // 7)}}))
            out.append(
                (
                    f"{method} {path} body:oversize-streamed",
                    method,
                    url,
                    {"content": _chunks(MARK * (BODY_CAP // 7 + 1)), "json_ct": True},
                )
            )
            if has_body:
                for v in OVERFLOWS[:2]:
                    body = "{" + ",".join(f'"{f}":{v}' for f in FIELDS) + "}"
                    out.append((f"{method} {path} body:overflow{v}", method, url, {"content": body, "json_ct": True}))
        if path.endswith("/stream"):
            for value in ("1e32", "9" * 40, "\u00b2", "-1"):
                out.append(
                    (
                        f"{method} {path} header:last-event-id={value}",
                        method,
                        url,
                        {"headers": {"Last-Event-ID": value.encode("latin-1")}},
                    )
                )
    return out


def _deep(leaf, depth: int):
    for _ in range(depth):
        leaf = {"a": leaf}
    return leaf


def _chunks(text: str):
    data = text.encode()
    for i in range(0, len(data), 16384):
        yield data[i : i + 16384]


@pytest.fixture
def api(redis_url, database_url):
    app = App(
        Settings(
            broker="redis",
            redis_url=redis_url,
            database_url=database_url,
            admin_token=TOKEN,
            api_max_body_bytes=BODY_CAP,
            api_max_json_bytes=BODY_CAP,
        )
    )
    make_task(app, "t1", user_id="mallory")
    user = user_key(app, "mallory")
    with serve(app) as base:
        yield app, base, {"Authorization": f"Bearer {TOKEN}"}, user
    app.close()


def walk(app, base: str, admin: dict, user: dict) -> dict[str, tuple[int, str, dict]]:
    """Every hostile request against the real server: {case id: (status, body, headers)}."""
    answers = {}
    with httpx.Client(base_url=base, timeout=30) as client:
        for case_id, method, url, options in cases(create_app(app)):
            options = dict(options)
            headers = {**_auth_for(url, admin, user), **options.pop("headers", {})}
            if options.pop("json_ct", False):
                headers["content-type"] = "application/json"
            try:
                response = client.request(method, url, headers=headers, **options)
            except httpx.TransportError as exc:  # the server dropped the connection: no answer at all
                answers[case_id] = (0, f"no answer: {type(exc).__name__}", {})
                continue
            answers[case_id] = (response.status_code, response.text, dict(response.headers))
    return answers


def test_every_route_answers_hostile_input_with_a_4xx_no_traceback_and_no_echo(api):
    walked = walk(*api)
    assert len(walked) > 150, "the walk found fewer routes than the app has"
    bad = []
    for case_id, (status, text, _) in walked.items():
        problems = []
        if not 400 <= status < 500:
            problems.append(f"status {status}")
        if "Traceback" in text or 'File "' in text:
            problems.append("traceback")
        if MARK in text or any(v in text for v in OVERFLOWS[:2]):
            problems.append("echoes the input")
        if problems:
            bad.append(f"{case_id}: {', '.join(problems)}: {text[:160]!r}")
    assert not bad, f"{len(bad)} of {len(walked)} hostile requests:\n" + "\n".join(bad)

    # Bad input names the field; bodies over the cap answer 413, declared or streamed.
    status, text, _ = walked["POST /api/tasks/{task_id}/runs body:nul"]
    assert status == 400 and json.loads(text)["detail"][0]["loc"] == ["body"]
    status, text, _ = walked["PUT /api/resources/{resource_id} body:oversize"]
    assert status == 413
    assert walked["PUT /api/resources/{resource_id} body:oversize-streamed"][0] == 413
    status, text, _ = walked["GET /api/admin/jobs query:cursor=overflow9223372036854775808"]
    assert status in (400, 422) and "cursor" in text
    status, text, _ = walked["POST /api/schedules body:nul"]
    assert status == 400
    detail = json.loads(walked["GET /api/runs/{run_id}/stream query:after=overflow1e32"][1])["detail"]
    assert detail[0]["loc"] == ["query", "after"] and "input" not in detail[0]

    # Every answer, refusals included, carries the security headers.
    for case_id, (_, _, headers) in walked.items():
        assert headers.get("x-frame-options") == "DENY", case_id
        assert headers.get("x-content-type-options") == "nosniff", case_id
        assert headers.get("referrer-policy") == "no-referrer", case_id
        assert "script-src 'self'" in headers.get("content-security-policy", ""), case_id


def test_the_schedules_422_does_not_echo_the_request(api):
    app, base, admin, _ = api
    secret_env = "sk-secret-value-in-env-77"
    with httpx.Client(base_url=base, timeout=30) as client:
        response = client.post(
            "/api/schedules",
            headers=admin,
            json={
                "cron": "not a cron",
                "job": "build.run",
                "payload": {"env": {"K": secret_env}},
                "unknown": secret_env,
            },
        )
    assert response.status_code == 422
    assert secret_env not in response.text and "not a cron" not in response.text
    assert {tuple(e["loc"]) for e in response.json()["detail"]} == {("body", "unknown")}


def test_an_unhandled_error_answers_500_with_an_error_id_only(api, caplog):
    """A route that fails unexpectedly shows the client an id only; the log has the error, scrubbed of secrets."""
    import asyncio
    import logging

    app = api[0]
    broken = create_app(app)

    @broken.get("/boom")
    def boom():
        raise RuntimeError(f"internal detail {TOKEN}")

    async def call():
        transport = httpx.ASGITransport(app=broken, raise_app_exceptions=False)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
            return await client.get("/boom")

    caplog.set_level(logging.INFO, logger="conveyor.events")
    response = asyncio.run(call())
    assert response.status_code == 500
    body = response.json()
    assert set(body) == {"detail", "error_id"} and len(body["error_id"]) == 16
    assert "internal detail" not in response.text and "Traceback" not in response.text
    [line] = [json.loads(r.getMessage()) for r in caplog.records if '"api_error"' in r.getMessage()]
    assert line["error_id"] == body["error_id"] and "RuntimeError: internal detail [redacted]" in line["error"]
    assert TOKEN not in caplog.text


def test_a_deeply_nested_batch_line_is_refused_without_a_traceback(redis_url, database_url, clean_env):
    env = cli_env(clean_env, REDIS_URL=redis_url, DATABASE_URL=database_url, CONVEYOR_BROKER="redis")
    for line in ("[" * 100_000 + "]" * 100_000, json.dumps({"job": "credit.consume", "payload": _deep(1, 100)})):
        done = subprocess.run(
            [sys.executable, "-m", "conveyor", "enqueue", "--batch"],
            input=line + "\n",
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 2, done.stderr
        assert "Traceback" not in done.stderr and "line 1" in done.stderr and "deep" in done.stderr


def test_a_50_mb_body_is_refused_with_413_under_the_default_cap(redis_url, database_url):
    app = App(Settings(broker="redis", redis_url=redis_url, database_url=database_url, admin_token=TOKEN))
    try:
        make_task(app, "t1", user_id="mallory")
        user = user_key(app, "mallory")
        huge = json.dumps({"content": MARK * (50 * 1024 * 1024 // len(MARK))})
        with serve(app) as base, httpx.Client(base_url=base, timeout=60) as client:
            for headers in ({}, {"content-type": "application/json"}):
                try:
                    response = client.post(
                        "/api/tasks/t1/runs",
                        content=huge,
                        headers={**user, "content-type": "application/json", **headers},
                    )
                except httpx.TransportError:
                    continue  # the server answered 413 and closed before the client finished sending: refused too
                assert response.status_code == 413 and MARK not in response.text
                assert len(response.content) < 200
            streamed = client.post(
                "/api/tasks/t1/runs", content=_chunks(huge), headers={**user, "content-type": "application/json"}
            )
            assert streamed.status_code == 413 and MARK not in streamed.text
        with app.pool.connection() as conn:
            assert conn.execute("SELECT count(*) FROM messages").fetchone()[0] == 0
    finally:
        app.close()
