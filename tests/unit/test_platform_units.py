"""Pieces of the agent platform that need no server: the local model, parsers, chunking, fault choice."""

from __future__ import annotations

import asyncio

import pytest

from conveyor.platform.faults import chosen
from conveyor.platform.processors.indexing import chunk_text
from conveyor.platform.processors.memory import parse_memories
from conveyor.platform.providers.base import ChatMessage
from conveyor.platform.providers.local import LocalProvider, reply_chunks
from conveyor.platform.providers.openai import retry_after

CONVERSATION = [ChatMessage("system", "be brief"), ChatMessage("user", "Plan the postgres migration for friday")]


def read(generation) -> list[str]:
    """Every chunk of an async generation, read on a loop of its own."""

    async def chunks() -> list[str]:
        return [chunk async for chunk in generation]

    return asyncio.run(chunks())


def test_local_provider_is_deterministic_chunk_for_chunk():
    first = read(LocalProvider().stream(CONVERSATION))
    second = read(LocalProvider().stream(list(CONVERSATION)))

    assert first == second == reply_chunks(CONVERSATION)
    assert len(first) > 10
    other = read(LocalProvider().stream([ChatMessage("user", "something else entirely")]))
    assert other != first


def test_local_provider_reports_usage_once_the_stream_is_read():
    generation = LocalProvider().stream(CONVERSATION)
    assert generation.usage is None
    chunks = read(generation)

    assert generation.usage.completion_tokens == len(chunks)
    assert generation.usage.prompt_tokens == sum(len(m.content.split()) for m in CONVERSATION)


def test_a_local_reply_parses_into_memories_keyed_by_topic():
    text = asyncio.run(LocalProvider().complete(CONVERSATION)).text
    memories = parse_memories(text)

    assert len(memories) == 3
    assert {"postgres", "migration", "plan"} == set(memories)


def test_memory_parser_ignores_lines_without_a_topic_and_slugs_keys():
    assert parse_memories("- Favourite Editor: vim\nno colon here\n: empty topic\nx:\n") == {"favourite-editor": "vim"}


def test_chunks_overlap_and_cover_the_text():
    words = [f"w{i}" for i in range(300)]
    chunks = chunk_text(" ".join(words), words=100, overlap=10)

    assert [c.split()[0] for c in chunks] == ["w0", "w90", "w180", "w270"][: len(chunks)]
    assert set(" ".join(chunks).split()) == set(words)
    assert chunk_text("   ") == []


@pytest.mark.parametrize("value, expected", [("7", 7.0), ("0.5", 0.5), (None, 3.0), ("soon", 3.0), ("99999", 3600.0)])
def test_retry_after_reads_seconds_and_falls_back(value, expected):
    assert retry_after(value, 3.0) == expected


def test_retry_after_reads_an_http_date():
    import time
    from email.utils import formatdate

    assert 5 <= retry_after(formatdate(time.time() + 10, usegmt=True), 3.0) <= 10


def test_faults_choose_a_stable_share_of_keys():
    keys = [f"run:{n}" for n in range(2000)]
    picked = [k for k in keys if chosen(0.25, k)]

    assert 400 < len(picked) < 600
    assert picked == [k for k in keys if chosen(0.25, k)]
    assert not any(chosen(0, k) for k in keys)
