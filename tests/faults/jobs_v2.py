"""A job type only the newer workers of a rolling deploy know (the campaign's "old and new workers").

Producers and new workers load it (``CONVEYOR_IMPORTS=tests.faults.jobs,tests.faults.jobs_v2``);
an old worker loads ``tests.faults.jobs`` alone and must hand its messages back, not fail them.
"""

from __future__ import annotations

from conveyor.platform.queues import QUEUES
from conveyor.tasks.registry import job, on_final_failure
from tests.faults.jobs import WORK_QUEUES, Work, dead, work

for _queue in WORK_QUEUES:
    job(f"fault.v2.{_queue}", queue=QUEUES[_queue], payload=Work)(work)
    on_final_failure(f"fault.v2.{_queue}")(dead)
