"""An outside fuzzer against the running API: schemathesis, from the real app's OpenAPI document.

``conveyor api`` runs as a subprocess with private Redis and Postgres; a user with a live key and the
admin token are the callers (each route gets the credential its tag names, the builds routes both). For
every operation, schemathesis generates requests that match the document (positive) and requests that
break it (negative), with a fixed seed and a bounded number of examples; every answer must be no 5xx,
have a status the document names for it, match the document's schema and content type, and come
within a few seconds. It found (and the API layer now documents) the 422's shape, the Guard's
400/401/413 and the 404 of an id in the path.
"""

from __future__ import annotations

import collections
import time

import hypothesis
import hypothesis.errors
import pytest
import requests
import schemathesis
from hypothesis import HealthCheck, Phase
from schemathesis.checks import not_a_server_error
from schemathesis.core.failures import FailureGroup
from schemathesis.generation import GenerationMode
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from conveyor.app import App
from conveyor.platform import records
from conveyor.settings import Settings
from tests.support.api_process import conveyor_api
from tests.support.obs_support import TOKEN
from tests.support.platform_support import make_task, user_key

#: Examples per operation and generation mode: bounded, so the whole run takes about a minute.
EXAMPLES = 25
#: The slowest answer allowed (a real one takes milliseconds; generous for 2 shared cores).
MAX_SECONDS = 5.0
CHECKS = [status_code_conformance, not_a_server_error, response_schema_conformance, content_type_conformance]
#: Answers the document does not name yet, each owned by its route's module: (method, path, status).
#: The upload route reads its multipart form itself, so the document names no body and no 415.
UNDOCUMENTED = {("POST", "/api/agents/upload-and-deploy", 415)}
#: Path parameters naming the caller's own records, for a further positive run past the 404s.
OWN = {
    ("POST", "/api/tasks/{task_id}/runs"): {"task_id": "t1"},
    ("GET", "/api/resources/{resource_id}"): {"resource_id": "doc1"},
}


def _callers(operation, user: dict[str, str], admin: dict[str, str]) -> list[dict[str, str]]:
    tags = set(operation.definition.raw.get("tags", []))
    if ("builds" in tags and "/deployments/" not in operation.path) or "events" in tags:
        return [user, admin]
    if tags & {"admin", "schedules"} or "/deployments/" in operation.path:
        return [admin]
    if tags & {"runs", "resources"}:
        return [user]
    return [{}]  # open routes: no credentials


@pytest.mark.timeout(900)
def test_schemathesis_finds_no_5xx_no_schema_violation_and_no_slow_answer(clean_env, tmp_path, database_url, redis_url):
    app = App(Settings(broker="redis", redis_url=redis_url, database_url=database_url, admin_token=TOKEN))
    try:
        make_task(app, "t1", user_id="fuzzer")
        user = user_key(app, "fuzzer")
        with app.pool.connection() as conn:
            records.upsert_resource(conn, id="doc1", user_id="fuzzer", task_id=None, title="t", body="text")
    finally:
        app.close()
    admin = {"Authorization": f"Bearer {TOKEN}"}
    failures: list[str] = []
    statuses: dict[str, collections.Counter[int]] = {}  # per operation, caller and mode: shown on a failure
    with conveyor_api(clean_env, tmp_path, database_url, redis_url) as (base, _):
        schema = schemathesis.openapi.from_url(f"{base}/openapi.json")
        operations = [result.ok() for result in schema.get_all_operations()]
        assert len(operations) > 15, "the fuzzer found fewer operations than the API has"
        session = requests.Session()
        for operation in operations:
            for headers in _callers(operation, user, admin):
                for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
                    failures += _fuzz(operation, mode, base, headers, session, statuses)
                own = OWN.get((operation.method.upper(), operation.path))
                if own is not None:
                    failures += _fuzz(operation, GenerationMode.POSITIVE, base, headers, session, statuses, own)
    print("\n".join(f"{label}: {dict(counts)}" for label, counts in statuses.items()))
    assert not failures, f"{len(failures)} failing cases:\n" + "\n\n".join(failures[:20])


def _fuzz(
    operation,
    mode,
    base: str,
    headers: dict[str, str],
    session: requests.Session,
    statuses: dict[str, collections.Counter[int]],
    path_parameters=None,
) -> list[str]:
    """Run one operation's examples in one mode; each failure as text (the first per distinct problem)."""
    found: dict[str, str] = {}
    label = f"{operation.method.upper()} {operation.path} {mode.value} {'key' if headers else 'open'}"

    @hypothesis.settings(
        max_examples=EXAMPLES,
        derandomize=True,  # the same cases on every run
        database=None,
        deadline=None,
        phases=[Phase.explicit, Phase.generate],  # no shrinking: report, keep the run short
        suppress_health_check=list(HealthCheck),
    )
    @hypothesis.given(case=operation.as_strategy(generation_mode=mode, path_parameters=path_parameters))
    def run(case) -> None:
        started = time.monotonic()
        try:
            response = case.call(base_url=base, headers=headers, session=session, timeout=MAX_SECONDS * 2)
        except requests.RequestException as exc:
            found.setdefault(f"no answer: {type(exc).__name__}", f"{case.method} {case.formatted_path}: {exc}")
            return
        took = time.monotonic() - started
        statuses.setdefault(label, collections.Counter())[response.status_code] += 1
        if took > MAX_SECONDS:
            found.setdefault("slow", f"{case.method} {case.formatted_path}: {took:.1f} s")
        try:
            known = (case.method.upper(), operation.path, response.status_code) in UNDOCUMENTED
            checks = [check for check in CHECKS if not (known and check is status_code_conformance)]
            case.validate_response(response, checks=checks, headers=headers)
        except FailureGroup as exc:
            key = f"{response.status_code} {str(exc).splitlines()[0][:120]}"
            found.setdefault(key, f"[{mode.value}] {case.method} {operation.path}: {str(exc)[:1500]}")

    try:
        run()
    except hypothesis.errors.Unsatisfiable:
        assert mode is GenerationMode.NEGATIVE, operation.path  # nothing to break (no parameters, no body)
    return list(found.values())
