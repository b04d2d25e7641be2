"""The module-level registration functions: thin delegates to the default blueprint.

``job``, ``on_final_failure`` and ``check_settings`` register on
:data:`conveyor.blueprints.DEFAULT`, which an App built from the environment
includes. A package with its own job types makes its own
:class:`~conveyor.blueprints.Jobs` instead.
"""

from __future__ import annotations

from conveyor.blueprints import DEFAULT, FinalFailureHook, JobHandle, Jobs, JobType, Processor, SettingsCheck

__all__ = [
    "FinalFailureHook",
    "JobHandle",
    "JobType",
    "Jobs",
    "Processor",
    "SettingsCheck",
    "check_settings",
    "job",
    "on_final_failure",
]

job = DEFAULT.job
on_final_failure = DEFAULT.on_final_failure
check_settings = DEFAULT.check_settings
