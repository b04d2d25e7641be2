"""A ValueError is no answer the API gives on purpose: the real app installs no handler for it, so one
that reaches a route is a bug and the Guard answers 500 with an error id. A named ConveyorError still
gets its table status. No servers: the inline broker, over httpx's ASGI transport."""

from __future__ import annotations

import asyncio
import json
import logging

import httpx
import pytest
from fastapi import FastAPI

from conveyor import App
from conveyor.api import create_app
from conveyor.errors import InvalidQuery
from conveyor.settings import Settings

MARK = "zq9mark"


@pytest.fixture
def api():
    app = App(Settings(broker="inline", database_url="postgresql://unused/db"))
    broken = create_app(app)

    @broken.get("/unnamed")
    def unnamed() -> None:
        raise ValueError(f"bad value {MARK}")

    @broken.get("/named")
    def named() -> None:
        raise InvalidQuery("state: not a job state")

    yield broken
    app.close()


def get(api: FastAPI, path: str) -> httpx.Response:
    async def call() -> httpx.Response:
        transport = httpx.ASGITransport(app=api, raise_app_exceptions=False)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
            return await client.get(path)

    return asyncio.run(call())


def test_no_exception_handler_for_value_error_is_installed(api):
    handled = [key for key in api.exception_handlers if isinstance(key, type)]
    assert not [cls for cls in handled if issubclass(cls, ValueError)], "ValueError (or a subclass) has a handler"


def test_an_unnamed_value_error_in_a_route_answers_500_with_an_error_id(api, caplog):
    caplog.set_level(logging.INFO, logger="conveyor.events")
    response = get(api, "/unnamed")
    assert response.status_code == 500
    body = response.json()
    assert set(body) == {"detail", "error_id"} and len(body["error_id"]) == 16
    assert MARK not in response.text and "Traceback" not in response.text
    [line] = [json.loads(r.getMessage()) for r in caplog.records if '"api_error"' in r.getMessage()]
    assert line["error_id"] == body["error_id"] and line["error"].startswith("ValueError: bad value")


def test_a_named_error_still_answers_its_table_status(api):
    response = get(api, "/named")
    assert (response.status_code, response.json()) == (400, {"detail": "state: not a job state"})
