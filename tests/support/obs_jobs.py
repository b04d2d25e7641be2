"""Job types for the observability tests (loaded with CONVEYOR_IMPORTS=tests.support.obs_jobs).

``obs.work`` carries a secret field, so tests can check it never shows;
it fails on purpose while told to, and can be slowed down.
"""

from __future__ import annotations

import os
import time
from typing import ClassVar

from conveyor.blueprints import Jobs
from conveyor.errors import JobError
from conveyor.platform.queues import INDEXING
from conveyor.tasks.context import JobContext
from conveyor.tasks.payloads import Payload

#: This module's blueprint: an App whose CONVEYOR_IMPORTS names the module includes it.
jobs = Jobs()


class ObsWork(Payload):
    secret_fields: ClassVar[frozenset[str]] = frozenset({"api_key"})

    n: int = 0
    api_key: str = ""
    #: Fail while a file exists at this path ("" never).
    fail_while: str = ""
    #: Fail the first N attempts.
    fail_first: int = 0
    #: Always fail.
    fail: bool = False
    sleep: float = 0


@jobs.job("obs.work", queue=INDEXING, payload=ObsWork, max_attempts=3)
def work(payload: ObsWork, ctx: JobContext) -> None:
    # In slices: an interrupt (time limit, cancel) lands between two, not after one long C call.
    until = time.monotonic() + payload.sleep
    while time.monotonic() < until:
        time.sleep(min(0.05, max(0.0, until - time.monotonic())))
    if payload.fail or ctx.attempt <= payload.fail_first or (payload.fail_while and os.path.exists(payload.fail_while)):
        raise JobError(f"obs.work {payload.n} failed on purpose (attempt {ctx.attempt})")


class ObsLeak(Payload):
    """A job whose error message carries its secret field: tracebacks shown must be scrubbed of it."""

    secret_fields: ClassVar[frozenset[str]] = frozenset({"api_key"})

    api_key: str = ""
    #: Fail the first N attempts, then complete.
    fail_first: int = 99


@jobs.job("obs.leak", queue=INDEXING, payload=ObsLeak, max_attempts=2)
def leak(payload: ObsLeak, ctx: JobContext) -> None:
    if ctx.attempt <= payload.fail_first:
        _call_the_provider(payload.api_key, ctx.attempt)


def _call_the_provider(api_key: str, attempt: int) -> None:
    raise RuntimeError(f"provider refused key {api_key} on attempt {attempt}")
