"""The platform's routes, commands and schedule firer come with its blueprint, and only with it. No servers."""

from __future__ import annotations

import pytest

from conveyor import App
from conveyor.api import create_app
from conveyor.cli import build_parser
from conveyor.settings import Settings

PLATFORM_PREFIXES = ("/api/tasks", "/api/runs", "/api/resources", "/api/schedules", "/api/builds")
PLATFORM_COMMANDS = {"demo", "build", "schedules"}


def _settings(**values: object) -> Settings:
    return Settings(**{"broker": "inline", "database_url": "postgresql://unused/db", **values})


def _prefixes(paths: set[str], prefixes: tuple[str, ...]) -> set[str]:
    """Which of ``prefixes`` some path starts with."""
    return {prefix for prefix in prefixes for path in paths if path.startswith(prefix)}


def _paths(app: App) -> set[str]:
    try:
        return set(create_app(app).openapi()["paths"])
    finally:
        app.close()


def _commands() -> set[str]:
    parser = build_parser()
    return set(next(a for a in parser._actions if a.dest == "command").choices)  # type: ignore[arg-type]


def test_an_app_without_the_platform_serves_none_of_its_routes_but_the_librarys():
    paths = _paths(App(_settings(platform=False)))
    assert not _prefixes(paths, PLATFORM_PREFIXES)
    assert _prefixes(paths, ("/api/admin",)) == {"/api/admin"}


def test_the_default_app_serves_the_platforms_routes_its_blueprint_brings():
    app = App(_settings())
    assert any(b.routers for b in app.blueprints)
    assert _prefixes(_paths(app), PLATFORM_PREFIXES) == set(PLATFORM_PREFIXES)


def test_the_platforms_commands_are_there_only_when_the_environment_includes_it(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.delenv("CONVEYOR_PLATFORM", raising=False)
    assert PLATFORM_COMMANDS <= _commands()
    monkeypatch.setenv("CONVEYOR_PLATFORM", "false")
    without = _commands()
    assert not without & PLATFORM_COMMANDS and {"worker", "up", "migrate", "scheduler", "enqueue"} <= without


def test_the_platforms_schedule_firer_comes_with_its_blueprint():
    with_platform, without = App(_settings()), App(_settings(platform=False))
    try:
        assert [f for b in with_platform.blueprints for f in b.firers]
        assert not [f for b in without.blueprints for f in b.firers]
    finally:
        with_platform.close()
        without.close()
