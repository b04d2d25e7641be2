"""The OpenAI-compatible provider against a real local server: streaming, usage, 429, dropped connections."""

from __future__ import annotations

import asyncio
import logging
import threading

import pytest
from pydantic import SecretStr

from conveyor.app import App
from conveyor.errors import JobError, RetryLater
from conveyor.platform.errors import ProviderError, ProviderRateLimited, ProviderRejected
from conveyor.platform.providers.base import ChatMessage
from conveyor.platform.providers.openai import OpenAIProvider
from conveyor.platform.settings import PlatformSettings
from conveyor.settings import Settings
from tests.support.chat_server import ChatServer
from tests.support.platform_support import completed_round, workers
from tests.support.waiting import wait_for

KEY = "sk-test-very-secret-0123456789"
QUESTION = [ChatMessage("user", "hello there")]


def read(provider: OpenAIProvider, generation) -> list[str]:
    """Every chunk of ``generation``, on a loop of its own; the provider's client on that loop closed after."""

    async def chunks() -> list[str]:
        try:
            return [chunk async for chunk in generation]
        finally:
            await generation.aclose()
            await provider.aclose()

    return asyncio.run(chunks())


@pytest.fixture
def provider():
    """Factory of providers on a server, each closed after the test."""
    made = []

    def make(server: ChatServer) -> OpenAIProvider:
        made.append(
            OpenAIProvider(
                base_url=server.base_url, api_key=SecretStr(KEY), model="tiny", timeout=10, default_retry_after=2
            )
        )
        return made[-1]

    yield make
    for p in made:
        p.close()


def test_streams_chunks_and_reports_usage(provider):
    with ChatServer([("ok", "The answer is forty two.")]) as server:
        p = provider(server)
        generation = p.stream(QUESTION)
        chunks = read(p, generation)

    assert "".join(chunks) == "The answer is forty two."
    assert len(chunks) == 5
    assert (generation.usage.prompt_tokens, generation.usage.completion_tokens) == (7, 5)
    request = server.requests[0]
    assert request["path"] == "/v1/chat/completions"
    assert request["authorization"] == f"Bearer {KEY}"
    assert request["body"]["stream"] is True and request["body"]["model"] == "tiny"
    assert request["body"]["messages"] == [{"role": "user", "content": "hello there"}]


def test_each_event_loop_gets_its_own_client_and_close_closes_each_on_its_loop(provider):
    """A worker's long-lived loop and another loop (a test's asyncio.run) use one provider at once: an
    httpx.AsyncClient's connections belong to its loop, so each loop gets its own; close() (App.close, from
    another thread) closes the running loop's client on that loop."""
    with ChatServer([("ok", "from the worker loop"), ("ok", "from another loop")]) as server:
        p = provider(server)
        loop = asyncio.new_event_loop()
        thread = threading.Thread(target=loop.run_forever, daemon=True)
        thread.start()

        used = []

        async def ask() -> str:
            generation = p.stream(QUESTION)
            try:
                return "".join([chunk async for chunk in generation])
            finally:
                await generation.aclose()
                used.append(p._client())  # the client this loop's request went through

        async def ask_then_close() -> str:
            try:
                return await ask()
            finally:
                await p.aclose()

        try:
            assert asyncio.run_coroutine_threadsafe(ask(), loop).result(30) == "from the worker loop"
            (worker_client,) = p._clients.values()
            assert asyncio.run(ask_then_close()) == "from another loop"
            assert used[0] is worker_client and used[1] is not worker_client and used[1].is_closed
            assert list(p._clients.values()) == [worker_client]  # the other loop's was its own, closed there
            assert not worker_client.is_closed
            p.close()
            assert worker_client.is_closed and not p._clients
        finally:
            loop.call_soon_threadsafe(loop.stop)
            thread.join(10)
            loop.close()


def test_a_429_is_a_delay_with_the_servers_retry_after_not_a_failure(provider):
    with ChatServer([("429", 7), ("429", "")]) as server:
        p = provider(server)
        with pytest.raises(ProviderRateLimited) as first:
            read(p, p.stream(QUESTION))
        with pytest.raises(ProviderRateLimited) as second:
            read(p, p.stream(QUESTION))

    assert isinstance(first.value, RetryLater)
    assert first.value.delay == 7
    assert second.value.delay == 2  # no Retry-After: the configured default


def test_a_dropped_connection_is_a_retryable_provider_error(provider):
    with ChatServer([("drop", "this reply never finishes properly at all")]) as server:
        with pytest.raises(ProviderError) as raised:
            p = provider(server)
            read(p, p.stream(QUESTION))
    assert not isinstance(raised.value, (ProviderRejected, RetryLater))
    assert "connection" in str(raised.value)


def test_server_errors_retry_and_client_errors_do_not(provider):
    with ChatServer([("500", None)]) as server:
        with pytest.raises(ProviderError) as raised:
            p = provider(server)
            read(p, p.stream(QUESTION))
    assert not isinstance(raised.value, ProviderRejected)
    assert "upstream exploded" in str(raised.value)


def test_the_key_is_in_no_repr_or_error(caplog, provider):
    caplog.set_level(logging.DEBUG)
    with ChatServer([("429", 1), ("drop", "a b c d e f"), ("500", None)]) as server:
        p = provider(server)
        errors = []
        for _ in range(3):
            with pytest.raises(JobError) as raised:
                read(p, p.stream(QUESTION))
            errors.append(raised.value)
    assert KEY not in repr(p)
    assert all(KEY not in str(e) and KEY not in repr(e) for e in errors)
    assert KEY not in caplog.text


def test_memory_extraction_through_the_http_provider_waits_out_a_429_and_survives_a_drop(
    redis_url, database_url, caplog
):
    caplog.set_level(logging.INFO)
    script = [("429", 1), ("drop", "editor: vim\nshell: zsh\n"), ("ok", "editor: vim\nshell: zsh\n")]
    with ChatServer(script) as server:
        app = App(
            Settings(
                broker="redis",
                redis_url=redis_url,
                database_url=database_url,
                queues={"llm": {"min_backoff": 0.1, "max_backoff": 0.3}},
            ),
            blueprint_settings=[
                PlatformSettings(
                    provider="openai", openai_base_url=server.base_url, openai_api_key=KEY, openai_model="tiny"
                )
            ],
        )
        message_id = completed_round(
            app, task_id="t1", user_id="erin", question="which tools do I use?", answer="You use vim and zsh."
        )
        ref = app.jobs.enqueue("memory.extraction", {"user_id": "erin", "task_id": "t1", "message_id": message_id})
        with workers(app, queues=("llm",)):
            record = wait_for(
                lambda: (r := app.broker.get_job(ref.id)) and r.state in ("completed", "failed") and r,
                timeout=30,
                message="the extraction to finish",
            )

        assert record.state == "completed"
        assert record.attempts == 3  # deferred by the 429, retried after the drop, then done
        assert len(server.requests) == 3
        assert server.requests[1]["at"] - server.requests[0]["at"] >= 0.9  # Retry-After: 1 was honoured
        with app.pool.connection() as conn:
            rows = conn.execute("SELECT key, value FROM memories WHERE user_id = 'erin' ORDER BY key").fetchall()
        assert rows == [("editor", "vim"), ("shell", "zsh")]
        assert app.broker.queue_counts("llm").failed_total == 0
        assert KEY not in caplog.text
        app.close()
