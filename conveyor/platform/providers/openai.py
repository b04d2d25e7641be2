"""An OpenAI-compatible chat-completions provider over HTTP (httpx's async client), streaming.

Works with any server that speaks ``POST {base}/chat/completions`` with
``"stream": true`` (OpenAI, vLLM, llama.cpp, Ollama's OpenAI endpoint...).
A 429 is not a failure: it raises :class:`~conveyor.platform.errors.ProviderRateLimited`
with the server's ``Retry-After``, so the job runs again later without
spending an attempt. The API key is sent in a header and appears in no
error, log line or repr.

Async: a run awaiting the model holds no thread. An ``httpx.AsyncClient``'s
connections belong to the event loop that opened them, so the provider keeps
one client per loop (in a worker, the App's one loop; a test's
``asyncio.run`` gets its own), never one shared across loops.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import logging
import threading
import time
from email.utils import parsedate_to_datetime
from typing import TYPE_CHECKING, Any, AsyncIterator, Iterator, Sequence

import httpx
from pydantic import SecretStr

from conveyor.platform.errors import ProviderError, ProviderRateLimited, ProviderRejected
from conveyor.platform.providers.base import ChatMessage, Generation, Provider, Usage

if TYPE_CHECKING:
    from conveyor.platform.settings import PlatformSettings

#: A Retry-After beyond this is capped: the job is re-checked at least hourly.
MAX_RETRY_AFTER = 3600.0

#: How much of an error body is quoted in an error (the provider's explanation, never our request).
ERROR_BODY_CHARS = 300

#: Seconds ``close()`` waits for a loop's client to close on its loop (a few sockets' closes).
CLOSE_TIMEOUT = 5.0

logger = logging.getLogger("conveyor.platform.providers")


class OpenAIProvider(Provider):
    """Chat completions over HTTP; one provider per App, with one connection pool per event loop."""

    name = "openai"

    def __init__(
        self, *, base_url: str, api_key: SecretStr | None, model: str, timeout: float, default_retry_after: float
    ) -> None:
        self.model = model
        self.default_retry_after = default_retry_after
        headers = {"Accept": "text/event-stream"}
        if api_key is not None:
            headers["Authorization"] = f"Bearer {api_key.get_secret_value()}"
        self._base_url = base_url.rstrip("/") + "/"
        self._headers = headers
        self._timeout = httpx.Timeout(timeout)
        self._lock = threading.Lock()
        self._clients: dict[asyncio.AbstractEventLoop, httpx.AsyncClient] = {}

    @classmethod
    def from_settings(cls, settings: PlatformSettings) -> "OpenAIProvider":
        return cls(
            base_url=settings.openai_base_url,
            api_key=settings.openai_api_key,
            model=settings.openai_model,
            timeout=settings.provider_timeout,
            default_retry_after=settings.provider_retry_after,
        )

    def __repr__(self) -> str:
        return f"OpenAIProvider(base_url={self._base_url!r}, model={self.model!r})"

    def _client(self) -> httpx.AsyncClient:
        """The running loop's client, opened on its first request."""
        loop = asyncio.get_running_loop()
        with self._lock:
            client = self._clients.get(loop)
            if client is None:
                for gone in [other for other in self._clients if other.is_closed()]:
                    del self._clients[gone]  # its loop closed (a finished asyncio.run): nothing left to close on
                client = self._clients[loop] = httpx.AsyncClient(
                    base_url=self._base_url, headers=self._headers, timeout=self._timeout
                )
        return client

    async def aclose(self) -> None:
        """Close the running loop's client (a loop about to end: ``asyncio.run``'s)."""
        with self._lock:
            client = self._clients.pop(asyncio.get_running_loop(), None)
        if client is not None:
            await client.aclose()

    def close(self) -> None:
        """Close every loop's client on its own loop (the App's loop still runs when the App closes its provider)."""
        with self._lock:
            clients, self._clients = self._clients, {}
        try:
            here: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:
            here = None
        for loop, client in clients.items():
            if loop.is_closed():
                continue
            if loop is here:
                loop.create_task(client.aclose())
            elif loop.is_running():
                try:
                    asyncio.run_coroutine_threadsafe(client.aclose(), loop).result(CLOSE_TIMEOUT)
                except (concurrent.futures.TimeoutError, RuntimeError):
                    logger.warning("the provider's client on a busy event loop did not close in %ss", CLOSE_TIMEOUT)
            else:
                loop.run_until_complete(client.aclose())

    def stream(self, messages: Sequence[ChatMessage]) -> Generation:
        body = {
            "model": self.model,
            "messages": [{"role": m.role, "content": m.content} for m in messages],
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        return Generation(self._events(body))

    async def _events(self, body: dict[str, Any]) -> AsyncIterator[str | Usage]:
        try:
            async with self._client().stream("POST", "chat/completions", json=body) as response:
                await self._check(response)
                done = False
                async for line in response.aiter_lines():
                    if not line.startswith("data:"):
                        continue  # comments, event names, keep-alives
                    data = line[5:].strip()
                    if data == "[DONE]":
                        done = True
                        break
                    for item in _parse_event(data):
                        yield item
                if not done:
                    raise ProviderError("the provider's stream ended before [DONE] (connection dropped)")
        except httpx.TimeoutException as exc:
            raise ProviderError(f"the provider did not answer in time ({type(exc).__name__})") from None
        except httpx.TransportError as exc:
            # RemoteProtocolError: the connection closed mid-response.
            raise ProviderError(f"connection to the provider failed ({type(exc).__name__})") from None

    async def _check(self, response: httpx.Response) -> None:
        status = response.status_code
        if status < 400:
            return
        await response.aread()  # the error's body, and the connection stays reusable
        if status == 429:
            delay = retry_after(response.headers.get("retry-after"), self.default_retry_after)
            raise ProviderRateLimited(f"the provider rate-limited the request (429); retry in {delay:g}s", delay=delay)
        detail = _error_detail(response)
        if status >= 500 or status == 408:
            raise ProviderError(f"the provider failed with {status}: {detail}")
        raise ProviderRejected(f"the provider refused the request with {status}: {detail}")


def _parse_event(data: str) -> Iterator[str | Usage]:
    try:
        event = json.loads(data)
    except ValueError:
        raise ProviderError("the provider sent a chunk that is not JSON") from None
    if not isinstance(event, dict):
        raise ProviderError("the provider sent a chunk that is not a JSON object")
    if event.get("error"):
        error = event["error"]
        message = error.get("message") if isinstance(error, dict) else error
        raise ProviderError(f"the provider reported an error mid-stream: {str(message)[:ERROR_BODY_CHARS]}")
    for choice in event.get("choices") or ():
        content = (choice.get("delta") or {}).get("content")
        if content:
            yield content
    usage = event.get("usage")
    if isinstance(usage, dict):
        yield Usage(int(usage.get("prompt_tokens") or 0), int(usage.get("completion_tokens") or 0))


def _error_detail(response: httpx.Response) -> str:
    try:
        error = response.json().get("error")
        text = error.get("message") if isinstance(error, dict) else str(error)
    except (ValueError, AttributeError):
        text = response.text
    return (text or response.reason_phrase or "no detail")[:ERROR_BODY_CHARS]


def retry_after(value: str | None, default: float) -> float:
    """Seconds to wait from a ``Retry-After`` header (seconds or an HTTP date); ``default`` if absent or bad."""
    if not value:
        return default
    try:
        seconds = float(value)
    except ValueError:
        try:
            seconds = parsedate_to_datetime(value).timestamp() - time.time()
        except (TypeError, ValueError):
            return default
    return min(MAX_RETRY_AFTER, max(0.0, seconds))
