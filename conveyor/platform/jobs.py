"""The platform's job modules: importing this registers every platform job type and queue.

The App imports it by name, as it imports ``CONVEYOR_IMPORTS``, unless
``CONVEYOR_PLATFORM=false``.
"""

from __future__ import annotations

# The six queues first: their declaration order is the order workers and the dashboard list them.
from conveyor.platform import queues  # noqa: F401
from conveyor.platform.processors import agent_run, build, credit, finalize, indexing, memory, nudge, resume, schedule  # noqa: F401
