"""The agent platform's blueprint: its job types register here, its six queues first.

:mod:`conveyor.platform.jobs` imports every processor module and exposes it as ``jobs``;
the App includes it unless ``CONVEYOR_PLATFORM=false``.
"""

from __future__ import annotations

from conveyor.blueprints import Jobs
from conveyor.platform.queues import QUEUES

jobs = Jobs()
# Declared in order: the order workers and the dashboard list them.
for _queue in QUEUES.values():
    jobs.queue(_queue)
