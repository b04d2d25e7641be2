"""The one provider interface: stream a reply to a conversation, then report token usage."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Iterator, Literal, Sequence

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
    """A streamed reply: iterate it for text chunks; ``usage`` is known once it is exhausted.

    Providers build it from a generator yielding ``str`` chunks and, once,
    a :class:`Usage` (usually last, as chat-completions streams send it).
    """

    def __init__(self, source: Iterator[str | Usage]) -> None:
        self._source = source
        self.usage: Usage | None = None
        self.chunks = 0

    def __iter__(self) -> Iterator[str]:
        for item in self._source:
            if isinstance(item, Usage):
                self.usage = item
            elif item:
                self.chunks += 1
                yield item

    def close(self) -> None:
        """Stop early: closes the underlying response."""
        close = getattr(self._source, "close", None)
        if close:
            close()


class Provider(ABC):
    """A chat model. Implementations raise :class:`~conveyor.platform.errors.ProviderError` for failures a
    retry may fix, :class:`~conveyor.platform.errors.ProviderRateLimited` (a ``RetryLater``) when told to wait,
    and :class:`~conveyor.platform.errors.ProviderRejected` when the request itself is refused."""

    #: Short name for logs and records.
    name: str = "provider"

    @abstractmethod
    def stream(self, messages: Sequence[ChatMessage]) -> Generation:
        """Start a reply to ``messages``; nothing is sent until the generation is iterated."""

    def close(self) -> None:
        """Release connections; the default holds none."""

    def complete(self, messages: Sequence[ChatMessage]) -> Completion:
        """The whole reply at once (memory extraction does not stream)."""
        generation = self.stream(messages)
        text = "".join(generation)
        return Completion(text, generation.usage or estimate_usage(messages, text))


def estimate_usage(messages: Sequence[ChatMessage], reply: str) -> Usage:
    """Token counts approximated by words, for providers that report none."""
    return Usage(sum(len(m.content.split()) for m in messages), len(reply.split()))
