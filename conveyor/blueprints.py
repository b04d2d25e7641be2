"""Blueprints: the job types, queues and final-failure hooks a package brings, as one object.

A job module makes a :class:`Jobs` and registers on it; an :class:`~conveyor.app.App` is built from
a list of them (``App(jobs=[jobs])``), so two Apps in one process see disjoint job types and
nothing is registered process-wide (procrastinate's ``blueprints.py``). The agent platform is one
blueprint among others. The module-level :func:`~conveyor.job` registers on :data:`DEFAULT`, the
blueprint for the simplest case, which an App built from the environment includes::

    jobs = Jobs()
    EMAILS = Queue("emails", concurrency=8)

    @jobs.job("email.send", queue=EMAILS, payload=SendEmail)
    def send_email(payload: SendEmail, ctx: JobContext) -> None: ...

    app = App(jobs=[jobs])
    ref = send_email.enqueue({"to": "a@example.com"}, key="welcome:a")
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Generic, Iterable, Mapping, TypeVar, cast, overload

from pydantic import BaseModel

from conveyor.brokers.base import MAX_GROUP_LENGTH, MAX_GROUP_WEIGHT, valid_group_weight
from conveyor.budgets.base import Budget
from conveyor.errors import ConfigurationError, ConveyorError

if TYPE_CHECKING:
    from dramatiq import Middleware
    from psycopg import Connection
    from pydantic_settings import BaseSettings

    from conveyor.app import App
    from conveyor.brokers.base import JobRef
    from conveyor.inspector import JobView
    from conveyor.settings import Settings
    from conveyor.tasks.context import JobContext
    from conveyor.tasks.payloads import Payload

#: A queue name: it becomes part of environment variable names and broker keys.
QUEUE_NAME = re.compile(r"^[a-z][a-z0-9_]{0,63}$")

#: Attempts a job gets when neither its job type nor its queue says otherwise.
DEFAULT_MAX_ATTEMPTS = 3


@dataclass(frozen=True)
class Queue:
    """One queue: how many jobs run at once per worker process, and how jobs retry.

    A value: a blueprint registers it when a job uses it (or :meth:`Jobs.queue` declares it).
    Times are in seconds. ``max_attempts`` counts every start of a job: runs that raised and
    deliveries whose worker died alike. Every field can be overridden from the environment
    (``CONVEYOR_QUEUES__<QUEUE>__CONCURRENCY=4``).
    """

    name: str
    concurrency: int = 4
    max_attempts: int = DEFAULT_MAX_ATTEMPTS
    min_backoff: float = 1.0
    max_backoff: float = 60.0
    time_limit: float = 10 * 60
    why: str = ""
    #: At most this many jobs of one named group held (claimed or running) at once, fleet-wide;
    #: None: no cap. Groups are served round-robin either way (``enqueue(..., group=...)``).
    group_concurrency: int | None = None
    #: Named groups' weights (``{"vip": 3}``): a group of weight 3 gets three turns per round to a group of
    #: weight 1's (every group not named, and jobs without a group). 1 to 1000. These win over weights
    #: set at run time (``app.jobs.set_group_weight``). Kept as sorted (group, weight) pairs: a value.
    group_weights: Mapping[str, int] | tuple[tuple[str, int], ...] = ()
    #: Budgets every job of the queue takes from (``conveyor.budgets``), besides its job type's own.
    budgets: tuple[Budget, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "budgets", tuple(self.budgets))
        _check_budgets(f"queue {self.name!r}", self.budgets)
        if not QUEUE_NAME.match(self.name):
            raise ValueError(f"queue name {self.name!r} must match {QUEUE_NAME.pattern}")
        pairs = self.group_weights.items() if isinstance(self.group_weights, Mapping) else self.group_weights
        weights = tuple(sorted((str(g), w) for g, w in pairs))
        object.__setattr__(self, "group_weights", weights)
        for group, weight in weights:
            if not valid_group_weight(group, weight):
                raise ValueError(
                    f"queue {self.name!r}: group_weights must map group names (1-{MAX_GROUP_LENGTH} printable characters) "
                    f"to weights 1-{MAX_GROUP_WEIGHT}"
                )
        if self.group_concurrency is not None and self.group_concurrency < 1:
            raise ValueError(f"queue {self.name!r}: group_concurrency must be >= 1 (or None: no cap)")
        if self.concurrency < 1 or self.max_attempts < 1 or self.time_limit <= 0:
            raise ValueError(f"queue {self.name!r}: concurrency and max_attempts must be >= 1, time_limit > 0")


def _check_budgets(owner: str, budgets: tuple[Budget, ...]) -> None:
    names = [b.name for b in budgets]
    if any(not isinstance(b, Budget) for b in budgets) or len(set(names)) != len(names):
        raise ValueError(f"{owner}: budgets must be Budget values with distinct names")


Processor = Callable[[Any, "JobContext"], Any]
FinalFailureHook = Callable[[Any, str, "JobContext"], None]
SettingsCheck = Callable[["Settings"], None]
#: A check of a blueprint's own settings class (``check_settings(fn, of=cls)``): ``fn(the App's cls instance)``.
BlueprintCheck = tuple[Callable[[Any], None], "type[BaseSettings] | None"]

#: A job's payload model (a Payload, or any pydantic model such as a root union) and what its processor returns.
P = TypeVar("P", bound=BaseModel)
R = TypeVar("R")
#: A final-failure hook: ``hook(payload or None, error, ctx)``.
H = TypeVar("H", bound=FinalFailureHook)
#: A cancel hook: ``hook(payload or None, ctx)``, once, when a job that was running ends cancelled.
CancelHook = Callable[[Any, "JobContext"], None]
C = TypeVar("C", bound=CancelHook)
F = TypeVar("F", bound=Callable[[Any], None])


@dataclass(frozen=True)
class JobType:
    """One kind of job. ``time_limit`` and ``max_attempts`` override the queue's when set.

    ``store_result``: the processor's JSON return value is kept for ``CONVEYOR_RESULT_TTL``
    seconds, for :meth:`JobHandle.result` to read. ``budgets``: rate limits kept fleet-wide
    that each start of the job takes from before its body runs (``conveyor.budgets``).
    """

    name: str
    queue: str
    payload: type[Payload]
    run: Processor
    on_final_failure: FinalFailureHook | None = None
    time_limit: float | None = None
    max_attempts: int | None = None
    module: str = ""
    store_result: bool = False
    budgets: tuple[Budget, ...] = ()
    on_cancel: CancelHook | None = None

    def all_budgets(self, queue: Queue | None) -> tuple[Budget, ...]:
        """The queue's budgets, then the job type's own (a name in both: the job type's wins)."""
        own = {b.name for b in self.budgets}
        return (*(b for b in (queue.budgets if queue else ()) if b.name not in own), *self.budgets)

    def attempts(self, queue: Queue | None) -> int:
        """How many starts this job gets: its own ``max_attempts``, else its queue's, else the default."""
        return self.max_attempts or (queue.max_attempts if queue else DEFAULT_MAX_ATTEMPTS)


@dataclass(frozen=True)
class Schedule:
    """A cron schedule declared in code (:meth:`Jobs.schedule`): ``job`` with ``payload`` at each occurrence.

    ``name`` keys its fires (``cron:<name>:<fire time>``), so it must stay the same across
    deploys for an occurrence to fire once; it defaults to ``<job>@<cron>@<tz>``.
    """

    name: str
    cron: str
    job: str
    payload: dict[str, Any]
    tz: str = "UTC"


@dataclass(eq=False)
class Jobs:
    """A blueprint: job types, the queues they use, final-failure hooks, schedules, middleware; no globals.

    Compared by identity: two blueprints with the same contents are still two.

    ``app`` is the last :class:`~conveyor.app.App` built with this blueprint: the one a
    handle's :meth:`JobHandle.enqueue` and :meth:`JobHandle.result` go through.
    """

    job_types: dict[str, JobType] = field(default_factory=dict)
    queues: dict[str, Queue] = field(default_factory=dict)
    settings_checks: list[BlueprintCheck] = field(default_factory=list)
    #: The blueprint's own settings classes (``add_settings``), each with its ``--help`` heading: an App
    #: that includes the blueprint reads them from the environment when it is built (``App.settings_of``).
    settings_classes: list[tuple[type[BaseSettings], str]] = field(default_factory=list)
    schedules: list[Schedule] = field(default_factory=list)
    #: Factories of Dramatiq middleware every App with this blueprint adds (a worker started by
    #: ``conveyor worker`` too): called once per App, so no instance is shared between brokers.
    middleware: list[Callable[[], Middleware]] = field(default_factory=list)
    #: What the blueprint adds to the HTTP API and to the ``conveyor`` command, named by module so
    #: nothing is imported until served or parsed: ``"module:attribute"`` of FastAPI routers
    #: (:func:`conveyor.api.app.create_app` includes them), modules with a ``register(subparsers)``.
    routers: list[str] = field(default_factory=list)
    commands: list[str] = field(default_factory=list)
    #: Factories of schedule firers (``firer(app)``, with ``tick()`` and ``run(stop)``) that
    #: ``conveyor scheduler`` and ``conveyor up`` run besides the code schedules' own.
    firers: list[Callable[[App], Any]] = field(default_factory=list)
    #: Directories of numbered ``NNNN_*.sql`` migrations applied with the library's (``conveyor migrate``).
    migrations: list[Path] = field(default_factory=list)
    app: App | None = field(default=None, repr=False, compare=False)

    def queue(self, queue: Queue | str, **fields: Any) -> Queue:
        """Declare a queue (a :class:`Queue`, or a name and its fields) and return it.

        Declaring the same queue again is harmless; another queue of the same name is an error.
        """
        spec = queue if isinstance(queue, Queue) else Queue(queue, **fields)
        known = self.queues.get(spec.name)
        if known is not None and known != spec:
            raise ValueError(f"queue {spec.name!r} is declared twice with different settings")
        self.queues.setdefault(spec.name, spec)
        return spec

    def job(
        self,
        name: str,
        *,
        queue: Queue | str,
        payload: type[P],
        time_limit: float | None = None,
        max_attempts: int | None = None,
        store_result: bool = False,
        budgets: Iterable[Budget] = (),
    ) -> Callable[[Callable[[P, JobContext], R]], JobHandle[P, R]]:
        """Register the decorated function as the processor of job ``name`` on ``queue``; returns its handle.

        ``queue`` is a :class:`Queue` (registered on this blueprint) or the name of a queue another
        blueprint of the App declares; a name none declares fails when the App is built.
        """
        if isinstance(queue, Queue):
            spec: Queue | None = self.queue(queue)
        elif isinstance(queue, str) and queue:
            spec = None
        else:
            raise ValueError(f"job {name!r}: queue must be a Queue or a queue name")
        own_budgets = tuple(budgets)
        _check_budgets(f"job {name!r}", own_budgets)

        def register(fn: Callable[[P, JobContext], R]) -> JobHandle[P, R]:
            previous = self.job_types.get(name)
            self.job_types[name] = JobType(
                name,
                spec.name if spec is not None else str(queue),
                # A root-model payload (the builds' union) is not a Payload subclass but has its
                # interface: load() and secret_fields, which is all the library calls.
                cast("type[Payload]", payload),
                fn,
                previous.on_final_failure if previous else None,
                time_limit,
                max_attempts,
                getattr(fn, "__module__", ""),
                store_result,
                own_budgets,
                previous.on_cancel if previous else None,
            )
            return JobHandle(self, name, fn)

        return register

    def on_final_failure(self, job: str | JobHandle[Any, Any]) -> Callable[[H], H]:
        """Register the decorated function to run once when ``job`` has spent its attempts.

        It drives the job's target to a terminal state (a build to ``failed``, say).
        The payload is None when the message could not be read at all.
        """
        name = job if isinstance(job, str) else job.name

        def register(fn: H) -> H:
            self.job_types[name] = replace(self.job_types[name], on_final_failure=fn)
            return fn

        return register

    def on_cancel(self, job: str | JobHandle[Any, Any]) -> Callable[[C], C]:
        """Register the decorated function to run once when a running ``job`` ends cancelled.

        Called as ``hook(payload, ctx)`` in the worker that ran the job, after the
        body stopped (by itself after seeing ``ctx.cancelled``, or interrupted after
        the grace) and before the ``cancelled`` outcome is written: undo or close
        what the run left half done. A job cancelled before it started has nothing
        to undo: the hook does not run for it.
        """
        name = job if isinstance(job, str) else job.name

        def register(fn: C) -> C:
            self.job_types[name] = replace(self.job_types[name], on_cancel=fn)
            return fn

        return register

    def schedule(
        self,
        cron: str,
        job: str | JobHandle[Any, Any],
        payload: BaseModel | dict[str, Any] | None = None,
        *,
        tz: str = "UTC",
        name: str | None = None,
    ) -> Schedule:
        """Enqueue ``job`` with ``payload`` at each occurrence of ``cron`` in zone ``tz``.

        ``conveyor scheduler`` fires it (any number of them: each occurrence is enqueued once,
        keyed); the job may come from any blueprint of the App, which checks the payload when
        it is built. A bad cron expression or zone fails here.
        """
        from conveyor.scheduling.cron import Cron

        try:
            Cron.parse(cron, tz)
        except ConveyorError as exc:
            raise ValueError(str(exc)) from None
        job_name = job if isinstance(job, str) else job.name
        data = payload.model_dump(mode="json") if isinstance(payload, BaseModel) else dict(payload or {})
        spec = Schedule(name or f"{job_name}@{cron}@{tz}", cron, job_name, data, tz)
        self.schedules.append(spec)
        return spec

    def add_middleware(self, factory: Callable[[], Middleware]) -> None:
        """Have every App built with this blueprint run ``factory()`` (a Middleware class, say) after conveyor's."""
        self.middleware.append(factory)

    def add_router(self, spec: str) -> None:
        """Serve the FastAPI router ``"module:attribute"`` in every App's HTTP API that includes this blueprint."""
        self.routers.append(spec)

    def add_commands(self, module: str) -> None:
        """Add the subcommands ``module``'s ``register(subparsers)`` declares to ``conveyor``, when this blueprint is loaded."""
        self.commands.append(module)

    def add_firer(self, factory: Callable[[App], Any]) -> None:
        """Have ``conveyor scheduler`` and ``conveyor up`` run ``factory(app)`` beside the code schedules' firer."""
        self.firers.append(factory)

    def add_migrations(self, directory: Path) -> None:
        """Apply ``directory``'s numbered migrations with the library's wherever an App with this blueprint migrates.

        Each is recorded by file name: pick numbers the library and other blueprints do not use.
        """
        self.migrations.append(directory)

    @overload
    def check_settings(self, fn: F, *, of: type[BaseSettings] | None = None) -> F: ...

    @overload
    def check_settings(self, fn: None = None, *, of: type[BaseSettings] | None = None) -> Callable[[F], F]: ...

    def check_settings(self, fn: F | None = None, *, of: type[BaseSettings] | None = None) -> F | Callable[[F], F]:
        """Register ``fn(settings)``: it raises ``ValueError`` when the settings this blueprint reads cannot work.

        ``settings`` is the App's :class:`~conveyor.settings.Settings`, or with ``of=cls`` (``@jobs.check_settings(of=cls)``)
        the App's instance of the blueprint's own settings class ``cls`` (:meth:`add_settings`).
        """

        def register(fn: F) -> F:
            self.settings_checks.append((fn, of))
            return fn

        return register(fn) if fn is not None else register

    def add_settings(self, model: type[BaseSettings], title: str) -> None:
        """Bring a settings class of the blueprint's own (a pydantic-settings ``BaseSettings``).

        An App that includes this blueprint builds it from the environment when it is built (a bad
        variable stops it with one line naming the variable, never its value) unless given one
        (``App(blueprint_settings=[...])``); its code reads it with ``app.settings_of(model)``. Its
        ``SecretStr`` values are scrubbed like the library's, and ``conveyor --help`` lists its
        variables under ``title``. An App without the blueprint never reads them.
        """
        if not any(known is model for known, _ in self.settings_classes):
            self.settings_classes.append((model, title))

    def bound_app(self, job: str) -> App:
        if self.app is None:
            raise ConfigurationError(f"job {job!r} belongs to no App yet: build App(jobs=[...]) with its blueprint")
        return self.app


class JobHandle(Generic[P, R]):
    """What ``@jobs.job`` returns: enqueue the job, read its results; still callable as the function."""

    def __init__(self, blueprint: Jobs, name: str, fn: Callable[[P, JobContext], R]) -> None:
        self.blueprint = blueprint
        self.name = name
        self.fn = fn
        self.__doc__ = fn.__doc__
        self.__wrapped__ = fn

    def __repr__(self) -> str:
        return f"<job {self.name}>"

    def __call__(self, payload: P, ctx: JobContext) -> R:
        return self.fn(payload, ctx)

    @property
    def job_type(self) -> JobType:
        return self.blueprint.job_types[self.name]

    def enqueue(
        self,
        payload: P | dict[str, Any],
        *,
        key: str | None = None,
        delay: float | None = None,
        priority: int = 0,
        connection: Connection[Any] | None = None,
        group: str | None = None,
    ) -> Enqueued[R]:
        """Enqueue this job on its App; the payload is checked against the job's model first.

        ``priority``: 0-9, higher first; ``group``: its fair-share group (see
        :meth:`conveyor.tasks.jobqueue.JobQueue.enqueue`)."""
        app = self.blueprint.bound_app(self.name)
        ref = app.jobs.enqueue(
            self.name, payload, key=key, delay=delay, priority=priority, connection=connection, group=group
        )
        return Enqueued(ref.id, ref.deduplicated, self.name, app)

    def get(self, job_id: str) -> JobView:
        """The job's state, attempts, errors and times."""
        return self.blueprint.bound_app(self.name).jobs.get(job_id)

    def cancel(self, job: str | Enqueued[R] | JobRef) -> str:
        """Cancel a job of this type (see :meth:`conveyor.tasks.jobqueue.JobQueue.cancel`)."""
        job_id = job if isinstance(job, str) else job.id
        return self.blueprint.bound_app(self.name).jobs.cancel(job_id)

    def result(self, job: str | Enqueued[R] | JobRef, timeout: float = 30.0) -> R:
        """The job's stored return value (``store_result=True``), waiting up to ``timeout`` seconds.

        Raises :class:`~conveyor.errors.JobFailed` if the job failed for good,
        :class:`~conveyor.errors.ResultTimeout` if it has not finished in time.
        """
        job_id = job if isinstance(job, str) else job.id
        return cast(R, self.blueprint.bound_app(self.name).jobs.result(job_id, timeout=timeout))


@dataclass(frozen=True)
class Enqueued(Generic[R]):
    """A job a handle enqueued: its id, whether it was a duplicate of an earlier keyed one, and its result."""

    id: str
    deduplicated: bool
    job: str
    app: App = field(repr=False, compare=False)

    def get(self) -> JobView:
        """The job's state, attempts, errors and times."""
        return self.app.jobs.get(self.id)

    def cancel(self) -> str:
        """Cancel this job (see :meth:`conveyor.tasks.jobqueue.JobQueue.cancel`)."""
        return self.app.jobs.cancel(self.id)

    def result(self, timeout: float = 30.0) -> R:
        """The job's stored return value once it succeeded (see :meth:`JobHandle.result`)."""
        return cast(R, self.app.jobs.result(self.id, timeout=timeout))


#: The blueprint of the module-level :func:`~conveyor.job`, for the simplest case: an App built from
#: the environment (``App()``, ``conveyor worker``) includes it after the platform and CONVEYOR_IMPORTS'.
DEFAULT = Jobs()


def blueprints_in(namespace: Iterable[object]) -> list[Jobs]:
    """The :class:`Jobs` among ``namespace``'s values (a module's globals), once each, in order."""
    out: list[Jobs] = []
    for value in namespace:
        if isinstance(value, Jobs) and not any(value is b for b in out):
            out.append(value)
    return out


@dataclass(frozen=True)
class Composed:
    """What an App's blueprints bring together."""

    job_types: dict[str, JobType]
    queues: dict[str, Queue]
    settings_checks: list[BlueprintCheck]
    schedules: dict[str, Schedule]
    settings_classes: list[tuple[type[BaseSettings], str]]


def compose(blueprints: Iterable[Jobs]) -> Composed:
    """The job types, queues, settings checks and schedules of ``blueprints`` together.

    A job name two blueprints both define, a queue name they declare differently, or a schedule
    name used twice is a :class:`~conveyor.errors.ConfigurationError`; so is a job on a queue
    none declares, and a schedule of a job none defines.
    """
    job_types: dict[str, JobType] = {}
    queues: dict[str, Queue] = {}
    checks: list[BlueprintCheck] = []
    schedules: dict[str, Schedule] = {}
    settings_classes: list[tuple[type[BaseSettings], str]] = []
    for blueprint in blueprints:
        for queue in blueprint.queues.values():
            if queues.setdefault(queue.name, queue) != queue:
                raise ConfigurationError(f"queue {queue.name!r} is declared twice with different settings")
        for name, job_type in blueprint.job_types.items():
            if job_types.setdefault(name, job_type) is not job_type:
                raise ConfigurationError(f"job {name!r} is defined by two blueprints")
        checks.extend(c for c in blueprint.settings_checks if c not in checks)
        settings_classes.extend(
            (model, title)
            for model, title in blueprint.settings_classes
            if all(m is not model for m, _ in settings_classes)
        )
        for spec in blueprint.schedules:
            if schedules.setdefault(spec.name, spec) is not spec:
                raise ConfigurationError(f"schedule {spec.name!r} is declared twice: give one another name=")
    undeclared = sorted(f"{t.name} (queue {t.queue!r})" for t in job_types.values() if t.queue not in queues)
    if undeclared:
        raise ConfigurationError(
            f"job(s) on a queue no blueprint declares: {', '.join(undeclared)}; "
            f"declare it with jobs.job(..., queue=Queue(name))"
        )
    unknown = sorted(f"{s.name} (job {s.job!r})" for s in schedules.values() if s.job not in job_types)
    if unknown:
        raise ConfigurationError(f"schedule(s) of a job no blueprint defines: {', '.join(unknown)}")
    return Composed(job_types, queues, checks, schedules, settings_classes)
