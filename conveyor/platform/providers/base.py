"""The one provider interface: stream a reply to a conversation, then report token usage.

Providers are async: a run waiting on the model awaits on the worker's event
loop (``conveyor.tasks.aio``) and holds no thread, so one worker process keeps
its queue's whole concurrency of runs in flight on a few threads.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import AsyncGenerator, AsyncIterator, Literal, Sequence

Role = Literal["system", "user", "assistant"]


@dataclass(frozen=True)
class ChatMessage:
    """One message of the conversation sent to the model."""

    role: Role
    content: str


@dataclass(frozen=True)
class Usage:
    """Tokens one request used, as the provider counts them."""

    prompt_tokens: int
    completion_tokens: int

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


@dataclass(frozen=True)
class Completion:
    """A whole reply and its usage."""

    text: str
    usage: Usage


class Generation:
    """A streamed reply: ``async for`` it for text chunks; ``usage`` is known once it is exhausted.

    Providers build it from an async generator yielding ``str`` chunks and,
    once, a :class:`Usage` (usually last, as chat-completions streams send it).
    Call :meth:`aclose` when done (``finally``): a reply stopped early closes
    its response there.
    """

    def __init__(self, source: AsyncIterator[str | Usage]) -> None:
        self._source = source
        self._reading: AsyncGenerator[str, None] | None = None
        self.usage: Usage | None = None
        self.chunks = 0

    def __aiter__(self) -> AsyncIterator[str]:
        self._reading = self._chunks()
        return self._reading

    async def _chunks(self) -> AsyncGenerator[str, None]:
        async for item in self._source:
            if isinstance(item, Usage):
                self.usage = item
            elif item:
                self.chunks += 1
                yield item

    async def aclose(self) -> None:
        """Stop early: closes the underlying response (and the reading, on this loop, not left to the GC)."""
        if self._reading is not None:
            await self._reading.aclose()
        close = getattr(self._source, "aclose", None)
        if close:
            await close()


class Provider(ABC):
    """A chat model. Implementations raise :class:`~conveyor.platform.errors.ProviderError` for failures a
    retry may fix, :class:`~conveyor.platform.errors.ProviderRateLimited` (a ``RetryLater``) when told to wait,
    and :class:`~conveyor.platform.errors.ProviderRejected` when the request itself is refused."""

    #: Short name for logs and records.
    name: str = "provider"

    @abstractmethod
    def stream(self, messages: Sequence[ChatMessage]) -> Generation:
        """Start a reply to ``messages``; nothing is sent until the generation is iterated (on an event loop)."""

    def close(self) -> None:
        """Release connections (from any thread); the default holds none."""

    async def complete(self, messages: Sequence[ChatMessage]) -> Completion:
        """The whole reply at once (memory extraction does not stream)."""
        generation = self.stream(messages)
        try:
            text = "".join([chunk async for chunk in generation])
        finally:
            await generation.aclose()
        return Completion(text, generation.usage or estimate_usage(messages, text))


def estimate_usage(messages: Sequence[ChatMessage], reply: str) -> Usage:
    """Token counts approximated by words, for providers that report none."""
    return Usage(sum(len(m.content.split()) for m in messages), len(reply.split()))
