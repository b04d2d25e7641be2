"""The job types: name -> queue, payload model, processor, final-failure hook.

A job module registers its jobs with :func:`job` and declares their queues
with :class:`~conveyor.tasks.queues.Queue`; the worker loop never changes
when a job type is added. The agent platform's modules do it the same way.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Callable, Iterable, TypeVar, cast

from pydantic import BaseModel

from conveyor.importing import import_job_module
from conveyor.tasks.payloads import Payload
from conveyor.tasks.queues import DECLARED, DEFAULT_MAX_ATTEMPTS, OWNERS, Queue, declare_queue

if TYPE_CHECKING:
    from conveyor.settings import Settings
    from conveyor.tasks.context import JobContext

Processor = Callable[[Any, "JobContext"], Any]
FinalFailureHook = Callable[[Any, str, "JobContext"], None]
SettingsCheck = Callable[["Settings"], None]

#: A job's payload model (a :class:`Payload`, or any pydantic model such as a root union) and what its processor returns.
P = TypeVar("P", bound=BaseModel)
R = TypeVar("R")
#: A final-failure hook: ``hook(payload or None, error, ctx)``.
H = TypeVar("H", bound=FinalFailureHook)


@dataclass(frozen=True)
class JobType:
    """One kind of job. ``time_limit`` and ``max_attempts`` override the queue's when set."""

    name: str
    queue: str
    payload: type[Payload]
    run: Processor
    on_final_failure: FinalFailureHook | None = None
    time_limit: float | None = None
    max_attempts: int | None = None
    module: str = ""

    def attempts(self, queue: Queue | None) -> int:
        """How many starts this job gets: its own ``max_attempts``, else its queue's, else the default."""
        return self.max_attempts or (queue.max_attempts if queue else DEFAULT_MAX_ATTEMPTS)


JOB_TYPES: dict[str, JobType] = {}

#: Checks of the settings a job module reads, run when an App loads it (a bad value fails at start).
SETTINGS_CHECKS: list[tuple[str, SettingsCheck]] = []


def job(
    name: str,
    *,
    queue: Queue | str,
    payload: type[P],
    time_limit: float | None = None,
    max_attempts: int | None = None,
) -> Callable[[Callable[[P, "JobContext"], R]], Callable[[P, "JobContext"], R]]:
    """Register the decorated function as the processor of job ``name`` on ``queue``.

    ``queue`` is a :class:`~conveyor.tasks.queues.Queue` (declared here if it is new) or the
    name of a queue declared elsewhere; a name no module declares fails when an App loads the job.
    """
    if isinstance(queue, Queue):
        spec: Queue | None = queue
    elif isinstance(queue, str) and queue:
        spec = None
    else:
        raise ValueError(f"job {name!r}: queue must be a Queue or a queue name")

    def register(fn: Callable[[P, "JobContext"], R]) -> Callable[[P, "JobContext"], R]:
        if spec is not None:
            declare_queue(spec, module=fn.__module__)
        previous = JOB_TYPES.get(name)
        queue_name = spec.name if spec is not None else str(queue)
        JOB_TYPES[name] = JobType(
            name,
            queue_name,
            # A root-model payload (the builds' union) is not a Payload subclass but has its
            # interface: load() and secret_fields, which is all the library calls.
            cast(type[Payload], payload),
            fn,
            previous.on_final_failure if previous else None,
            time_limit,
            max_attempts,
            fn.__module__,
        )
        return fn

    return register


def on_final_failure(name: str) -> Callable[[H], H]:
    """Register the decorated function to run once when job ``name`` has spent its attempts.

    It drives the job's target to a terminal state (a build to ``failed``, say).
    The payload is None when the message could not be read at all.
    """

    def register(fn: H) -> H:
        JOB_TYPES[name] = replace(JOB_TYPES[name], on_final_failure=fn)
        return fn

    return register


def check_settings(fn: SettingsCheck) -> SettingsCheck:
    """Register ``fn(settings)``: it raises ``ValueError`` when the settings its module reads cannot work."""
    SETTINGS_CHECKS.append((fn.__module__, fn))
    return fn


def _owned_by(module: str, packages: Iterable[str]) -> bool:
    return any(module == p or module.startswith(p + ".") for p in packages)


def load_job_types(
    modules: Iterable[str] = (), *, exclude: Iterable[str] = (), paths: Iterable[str] = ()
) -> tuple[dict[str, JobType], dict[str, Queue]]:
    """Import the job ``modules``; return the job types and queues registered, less those ``exclude``'s packages own.

    A queue is left out with its owner only if no job type kept uses it; a kept job type on a
    queue nobody declared is a :class:`~conveyor.errors.ConfigurationError`.
    """
    from conveyor.errors import ConfigurationError

    for module in modules:
        import_job_module(module, paths)
    exclude = tuple(exclude)
    job_types = {n: t for n, t in JOB_TYPES.items() if not _owned_by(t.module, exclude)}
    used = {t.queue for t in job_types.values()}
    undeclared = sorted(f"{t.name} (queue {t.queue!r})" for t in job_types.values() if t.queue not in DECLARED)
    if undeclared:
        raise ConfigurationError(
            f"job(s) on a queue no module declares: {', '.join(undeclared)}; "
            f"declare it with job(..., queue=Queue(name))"
        )
    queues = {n: q for n, q in DECLARED.items() if n in used or not _owned_by(OWNERS.get(n, ""), exclude)}
    return job_types, queues


def check_loaded_settings(settings: "Settings", exclude: Iterable[str] = ()) -> None:
    """Run the settings checks of the loaded modules; a failing one is a ConfigurationError naming the setting."""
    from conveyor.errors import ConfigurationError

    exclude = tuple(exclude)
    for module, check in SETTINGS_CHECKS:
        if _owned_by(module, exclude):
            continue
        try:
            check(settings)
        except ValueError as exc:
            raise ConfigurationError(str(exc)) from None
