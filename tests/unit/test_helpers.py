"""The test helpers that need no server: wait_for, and clean_env over conftest's stripped environment."""

from __future__ import annotations

import os

import pytest

from tests.support.waiting import wait_for


def test_wait_for_returns_the_truthy_value():
    calls = iter([0, None, "ready"])
    assert wait_for(lambda: next(calls), timeout=5, interval=0) == "ready"


def test_wait_for_times_out_with_the_message():
    with pytest.raises(AssertionError, match="the queue to drain"):
        wait_for(lambda: False, timeout=0.1, interval=0.01, message="the queue to drain")


def test_clean_env_removes_conveyor_configuration(monkeypatch, request):
    for name in ("REDIS_URL", "DATABASE_URL", "JOB_FAILURE_WEBHOOK_URL", "CONVEYOR_BROKER"):
        monkeypatch.setenv(name, "x")
    monkeypatch.setenv("UNRELATED", "kept")
    env = request.getfixturevalue("clean_env")

    assert not [k for k in os.environ if k.startswith("CONVEYOR_")]
    assert "REDIS_URL" not in os.environ and "DATABASE_URL" not in os.environ
    assert "JOB_FAILURE_WEBHOOK_URL" not in os.environ
    assert os.environ["UNRELATED"] == "kept"
    env.setenv("CONVEYOR_BROKER", "redis")
    assert os.environ["CONVEYOR_BROKER"] == "redis"
