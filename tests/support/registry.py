"""The job registry as the test process holds it: every job module loaded once, then left alone.

A job module registers its jobs and queues when it is imported, in the process-wide
registry (``conveyor.tasks.registry.JOB_TYPES``, ``conveyor.tasks.queues.DECLARED`` and
``OWNERS``), and an App imports the modules its settings name. Importing is a one-way
step: a snapshot restored after a test would leave the module in ``sys.modules`` with
its jobs gone, so the next App naming it would silently miss them. So the session
imports every job module its Apps name before the first test (``conftest.py``), and a
test that changes the registry after that fails (the ``registry_unchanged`` guard):
which jobs an App knows no longer depends on which test ran first.

A test that needs a job type of its own puts it in a job module here and names it in
:data:`JOB_MODULES`; a module only a subprocess imports (a user's module written to a
temporary directory, say) needs neither.
"""

from __future__ import annotations

import importlib
from typing import Any

from conveyor.tasks import queues, registry

#: Every job module an App in the test process loads (by ``imports=`` in its settings, or the platform's).
JOB_MODULES = (
    "conveyor.platform.jobs",
    "tests.support.jobs",
    "tests.support.obs_jobs",
    "tests.support.sched_jobs",
    "tests.faults.jobs",
    "tests.faults.jobs_v2",
    "bench.conveyor_jobs",
)


def load_job_modules() -> None:
    """Import :data:`JOB_MODULES`, so every App of the session finds its jobs already registered."""
    for module in JOB_MODULES:
        importlib.import_module(module)


def snapshot() -> dict[str, Any]:
    """Copies of the registry's tables, to compare after a test."""
    return {
        "job types": dict(registry.JOB_TYPES),
        "settings checks": list(registry.SETTINGS_CHECKS),
        "declared queues": dict(queues.DECLARED),
        "queue owners": dict(queues.OWNERS),
    }


def changes(before: dict[str, Any], after: dict[str, Any]) -> list[str]:
    """What differs between two snapshots, one line per table (empty when nothing does)."""
    out = []
    for table, old in before.items():
        new = after[table]
        if new == old:
            continue
        if isinstance(old, dict):
            added = sorted(set(new) - set(old))
            removed = sorted(set(old) - set(new))
            replaced = sorted(k for k in set(old) & set(new) if old[k] != new[k])
            out.append(f"{table}: added {added}, removed {removed}, replaced {replaced}")
        else:
            out.append(f"{table}: {len(old)} before, {len(new)} after")
    return out
