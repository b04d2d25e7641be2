"""``python -m tests.support.unfenced_worker QUEUE``: one worker process without its self-fence watchdog.

A paused worker (SIGSTOP, a VM freeze) that resumes after its lease runs
its job's next lines and its watchdog's next check in whichever order the
scheduler picks: the watchdog polls, and cannot act while the process is
stopped. This process takes the worse order every time, so that a test
sees what a resumed worker's effects do (issue 18, finding 6). Configured
by the environment, as ``conveyor worker``'s children are (harness.env_for).
"""

from __future__ import annotations

import sys
import threading
from typing import Any

import conveyor.tasks.worker as worker_module
from conveyor.app import run_worker_process


class NoWatchdog(threading.Thread):
    """Stands in for the Watchdog: starts, stops, never fences."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(name="no-self-fence", daemon=True)

    def run(self) -> None:
        pass

    def stop(self) -> None:
        pass


if __name__ == "__main__":
    worker_module.Watchdog = NoWatchdog  # type: ignore[misc,assignment]
    run_worker_process(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 1)
