"""When OpenTelemetry is on (issue 22, item 5): CONVEYOR_OTEL decides, else an OTLP endpoint being set;
off, the App adds no tracing middleware."""

from __future__ import annotations

import pytest

from conveyor.app import App
from conveyor.settings import Settings


@pytest.mark.parametrize(
    ("env", "on"),
    [
        ({}, False),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"}, True),
        ({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://collector:4318/v1/traces"}, True),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": ""}, False),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318", "CONVEYOR_OTEL": "false"}, False),
        ({"CONVEYOR_OTEL": "true"}, True),
    ],
)
def test_tracing_is_on_only_when_configured(clean_env, env, on):
    for name, value in env.items():
        clean_env.setenv(name, value)
    assert Settings().tracing is on


def test_off_the_app_has_no_tracing_middleware(clean_env, tmp_path):
    app = App(Settings(broker="inline", data_dir=tmp_path))
    try:
        assert "Tracing" not in [type(m).__name__ for m in app.broker.middleware]
    finally:
        app.close()
