"""Failures injected on purpose (``CONVEYOR_FAULT_RATE``), so the demo and chaos tests exercise retries.

A job is chosen by a digest of its key, not at random, so which jobs fail
is known in advance; only a first attempt ever fails, so every chosen
job recovers on its retry. The rate is 0 unless configured.
"""

from __future__ import annotations

import hashlib

from conveyor.platform.errors import InjectedFault
from conveyor.platform.settings import platform_settings
from conveyor.tasks.context import JobContext


def chosen(rate: float, key: str) -> bool:
    """Whether the job with ``key`` is one that fails its first attempt at ``rate``."""
    if rate <= 0:
        return False
    draw = int.from_bytes(hashlib.sha256(key.encode()).digest()[:8], "big") / 2**64
    return draw < rate


#: The chunk after which a chosen streaming job fails (:func:`maybe_fail_mid_stream`): late enough
#: that readers have seen chunks, so the retry shows they are not sent twice.
MID_STREAM_CHUNK = 3


def maybe_fail(ctx: JobContext, key: str, where: str) -> None:
    """Raise :class:`~conveyor.platform.errors.InjectedFault` on the first attempt of a chosen job."""
    rate = platform_settings(ctx.app).fault_rate
    if ctx.attempt == 1 and chosen(rate, key):
        raise InjectedFault(f"fault injected {where} (CONVEYOR_FAULT_RATE={rate:g})")


def maybe_fail_mid_stream(ctx: JobContext, key: str, seq: int) -> None:
    """Where a streaming job calls the injector after each chunk: a chosen job fails after chunk
    :data:`MID_STREAM_CHUNK` of its first attempt; every other call does nothing."""
    if seq == MID_STREAM_CHUNK:
        maybe_fail(ctx, key, "mid-stream")
