"""The built-in provider: deterministic replies, no network, no key.

The same conversation always gets the same reply, chunk for chunk, so a
run that is re-run after its worker died streams exactly what the first
attempt streamed. Replies are lines of ``topic: sentence``, built from the
most frequent words of the user's messages, which is also the shape
memory extraction parses.
"""

from __future__ import annotations

import asyncio
import hashlib
import re
from collections import Counter
from typing import AsyncIterator, Sequence

from conveyor.platform.providers.base import ChatMessage, Generation, Provider, Usage

#: Words the local model builds its sentences from (indexed by a digest of the conversation).
VOCABULARY = (
    "prefers concise answers",
    "works in the morning",
    "uses postgres in production",
    "ships on fridays",
    "likes detailed examples",
    "keeps notes in markdown",
    "reviews code carefully",
    "tracks costs closely",
    "runs tests before merging",
    "writes python daily",
    "plans the week ahead",
    "asks about deadlines",
    "reads release notes",
    "favours small commits",
    "measures before optimising",
    "documents decisions",
)

#: Words too common to be a topic.
STOPWORDS = frozenset(
    "about after again also because been before being could does doing from have having here just like more "
    "most much only other over please should some such than that their them then there these they this those "
    "through very want were what when where which while will with would your yours into onto".split()
)

#: Topics a reply covers; lines per reply.
TOPICS = 3


class LocalProvider(Provider):
    """Deterministic replies with token counts by words; ``chunk_delay`` seconds between chunks."""

    name = "local"

    def __init__(self, chunk_delay: float = 0.0) -> None:
        self.chunk_delay = chunk_delay

    def stream(self, messages: Sequence[ChatMessage]) -> Generation:
        return Generation(self._generate(list(messages)))

    async def _generate(self, messages: list[ChatMessage]) -> AsyncIterator[str | Usage]:
        chunks = reply_chunks(messages)
        for n, chunk in enumerate(chunks):
            if n and self.chunk_delay:
                await asyncio.sleep(self.chunk_delay)  # a model takes time per token
            yield chunk
        yield Usage(sum(len(m.content.split()) for m in messages), len(chunks))


def reply_chunks(messages: Sequence[ChatMessage]) -> list[str]:
    """The reply to ``messages``, as the chunks it streams in (one word and its trailing space each)."""
    return re.findall(r"\S+\s*", reply_text(messages))


def reply_text(messages: Sequence[ChatMessage]) -> str:
    """The local model's whole reply to ``messages``."""
    digest = hashlib.sha256("\x1e".join(f"{m.role}\x1f{m.content}" for m in messages).encode()).digest()
    lines = []
    for n, topic in enumerate(_topics(messages)):
        first, second = VOCABULARY[digest[2 * n] % len(VOCABULARY)], VOCABULARY[digest[2 * n + 1] % len(VOCABULARY)]
        lines.append(f"{topic}: the user {first} and {second}.")
    return "\n".join(lines) + "\n"


def _topics(messages: Sequence[ChatMessage]) -> list[str]:
    words = [
        w
        for m in messages
        if m.role == "user"
        for w in re.findall(r"[a-z][a-z0-9]{3,}", m.content.lower())
        if w not in STOPWORDS
    ]
    ranked = [w for w, _ in Counter(words).most_common()]  # ties keep first-seen order: deterministic
    return list(dict.fromkeys([*ranked, "work", "habits", "tools"]))[:TOPICS]
