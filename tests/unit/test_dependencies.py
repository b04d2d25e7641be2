"""Every dependency pyproject.toml declares is imported somewhere (or is named here with why it is not).

A dependency is added only for what it does for conveyor; one nothing
imports (httpx2 was one) is removed, not kept "just in case".
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).parents[2]

#: Distributions whose import name differs from their name.
IMPORT_NAMES = {
    "pyyaml": "yaml",
    "psycopg-pool": "psycopg_pool",
    "prometheus-client": "prometheus_client",
    "pydantic-settings": "pydantic_settings",
    "dramatiq-postgres": "dramatiq_postgres",
    "swagger-ui-bundle-v2": "swagger_ui_bundle",
    "opentelemetry-api": "opentelemetry",
    "opentelemetry-sdk": "opentelemetry.sdk",
    "opentelemetry-exporter-otlp-proto-http": "opentelemetry.exporter.otlp.proto.http",
}

#: Used without an import statement, and what for.
NOT_IMPORTED = {
    "tzdata": "IANA zone data for zoneinfo on hosts (slim images) without /usr/share/zoneinfo",
    "pytest-timeout": "pytest plugin: the `timeout` setting of [tool.pytest.ini_options]",
    "ruff": "a command: `make lint` checks lint and format with it ([tool.ruff])",
    "mypy": "a command: `make lint` checks types with it ([tool.mypy])",
    "check-jsonschema": "a command: tests/acceptance/test_deploy_compose.py checks compose/ against the compose schema",
    "import-linter": "a command: `make lint` runs its `lint-imports` on the layer contracts ([tool.importlinter])",
    "py-spy": "a command: bench/shares.py samples a running worker with `py-spy record` (the bench extra)",
}


def _declared() -> list[str]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    specs = list(project["dependencies"])
    for extra in project.get("optional-dependencies", {}).values():
        specs.extend(extra)
    return [re.match(r"[A-Za-z0-9_.-]+", spec).group(0).lower() for spec in specs]


def _sources() -> str:
    return "\n".join(
        path.read_text(errors="replace")
        for folder in ("conveyor", "tests", "bench")
        for path in (ROOT / folder).rglob("*.py")
    )


def test_every_declared_dependency_is_imported_or_says_why_not():
    text = _sources()
    unused = []
    for name in _declared():
        if name in NOT_IMPORTED:
            continue
        module = IMPORT_NAMES.get(name, name.replace("-", "_"))
        if not re.search(rf"^\s*(import|from)\s+{re.escape(module)}(\.|\s|$)", text, re.MULTILINE):
            unused.append(name)
    assert not unused, f"declared but never imported: {unused}"
    assert "httpx2" not in _declared()


def test_the_exceptions_are_still_declared():
    declared = set(_declared())
    assert set(NOT_IMPORTED) <= declared, "an exception here names a dependency that was removed: drop it"
