"""The agent platform's blueprint: its job types register here, its seven queues first, and with them
the settings, HTTP routes, ``conveyor`` subcommands and schedule firer the platform brings.

:mod:`conveyor.platform.jobs` imports every processor module and exposes it as ``jobs``;
the App includes it unless ``CONVEYOR_PLATFORM=false``.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from conveyor.blueprints import Jobs
from conveyor.platform.queues import QUEUES
from conveyor.platform.settings import PlatformSettings

if TYPE_CHECKING:
    from conveyor.app import App
    from conveyor.platform.scheduling.scheduler import Scheduler

jobs = Jobs()
# Its provider, llm limits, streams, quotas, builds and demo: read (and checked) only by an App that includes it.
jobs.add_settings(PlatformSettings, "the agent platform")
# Declared in order: the order workers and the dashboard list them.
for _queue in QUEUES.values():
    jobs.queue(_queue)

jobs.add_migrations(Path(__file__).with_name("migrations"))
for _router in ("runs", "resources", "schedules", "builds"):
    jobs.add_router(f"conveyor.platform.api.{_router}:router")
for _commands in ("demo", "builds", "schedules"):
    jobs.add_commands(f"conveyor.platform.cli.{_commands}")


def _schedules_table(app: App) -> Scheduler:
    """The firer of the platform's table of schedules (``conveyor schedules``, ``/api/schedules``)."""
    from conveyor.platform.scheduling.scheduler import Scheduler

    return Scheduler(app)


jobs.add_firer(_schedules_table)
