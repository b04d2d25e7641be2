"""Waiting on a condition with a deadline, instead of sleeping and hoping."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def wait_for(predicate: Callable[[], T], timeout: float = 30, interval: float = 0.05, message: str = "") -> T:
    """Call `predicate` until it returns something truthy, and return that.

    Raises AssertionError naming `message` (or the predicate) if it is still
    falsy after `timeout` seconds. Exceptions from the predicate propagate:
    a condition that cannot be evaluated is a failure, not a "not yet".
    """
    deadline = time.monotonic() + timeout
    while True:
        result = predicate()
        if result:
            return result
        if time.monotonic() >= deadline:
            what = message or getattr(predicate, "__name__", repr(predicate))
            raise AssertionError(f"timed out after {timeout:g}s waiting for {what} (last value: {result!r})")
        time.sleep(interval)
