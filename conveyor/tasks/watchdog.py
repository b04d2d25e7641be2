"""The worker process's self-fence: no heartbeat for most of the lease, and the process exits.

A worker cut off from the broker's server (a partition, a server that
hangs) keeps running its jobs, while recovery, once the lease has passed
since its last heartbeat, hands those jobs to other workers. The broker
fences a stale run's writes (its outcome is refused), not its body: the
job's side effects would happen twice, side by side. Only the worker
process can stop that, and the only stop that cannot land in the wrong
place (in middleware, in an ack, in a worker thread's idle loop, as an
asynchronous exception can) is the process's end: ``os._exit``, at
``self_fence_fraction`` of the lease, before recovery can act. Its jobs
are then "killed mid-run", as after a SIGKILL, and recovered as new
deliveries; the supervisor restarts the process, which waits at boot
until the server answers again.
"""

from __future__ import annotations

import os
import threading
from typing import TYPE_CHECKING

from conveyor.logs import log_event

if TYPE_CHECKING:
    from conveyor.brokers.base import ConveyorBroker
    from conveyor.settings import Settings

#: Exit code of a self-fenced worker process (EX_TEMPFAIL): the supervisor restarts it without counting a crash.
SELF_FENCE_EXIT = 75

#: Seconds the watchdog gives its log line before it exits anyway (a blocked stderr must not keep the jobs alive).
LOG_GRACE = 0.5


class Watchdog(threading.Thread):
    """Exits the process once the broker's last successful heartbeat is older than the threshold."""

    def __init__(self, broker: ConveyorBroker, settings: Settings, queue: str | None = None) -> None:
        super().__init__(name="conveyor-self-fence", daemon=True)
        self.broker = broker
        self.queue = queue
        self.lease = settings.worker_lease
        self.threshold = settings.self_fence_threshold
        self.interval = settings.self_fence_interval
        self._stop = threading.Event()

    def stop(self) -> None:
        self._stop.set()

    def run(self) -> None:
        while not self._stop.wait(self.interval):
            age = self.broker.heartbeat_age()
            if age is not None and age > self.threshold:
                self.fence(age)

    def fence(self, age: float) -> None:
        """Log why, and end the process now: no cleanup, no drain (draining is what must not happen)."""
        threading.Timer(LOG_GRACE, os._exit, (SELF_FENCE_EXIT,)).start()
        log_event(
            "self_fence",
            level="error",
            queue=self.queue,
            job=None,
            job_id=None,
            attempt=None,
            pid=os.getpid(),
            heartbeat_age_s=round(age, 3),
            lease_s=self.lease,
            threshold_s=round(self.threshold, 3),
            reason="no heartbeat reached the server for most of the lease: exiting before recovery "
            "hands this worker's jobs to another",
        )
        os._exit(SELF_FENCE_EXIT)
