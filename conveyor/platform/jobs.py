"""The agent platform as one blueprint: ``jobs``, with every platform job type and queue on it.

The App includes it (loaded by name, as it imports ``CONVEYOR_IMPORTS``) unless
``CONVEYOR_PLATFORM=false``; a user's App includes it with ``App(jobs=[platform_jobs, mine])``.
"""

from __future__ import annotations

from conveyor.platform.blueprint import jobs
from conveyor.platform.processors import agent_run, build, credit, finalize, indexing, memory, nudge, resume, schedule  # noqa: F401

__all__ = ["jobs"]
