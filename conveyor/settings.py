"""The one settings object: everything conveyor reads from the environment.

Service URLs keep the names every platform already uses (``REDIS_URL``,
``DATABASE_URL``, ``JOB_FAILURE_WEBHOOK_URL``); everything else is
``CONVEYOR_*``. Per-queue overrides use a double underscore, for example
``CONVEYOR_QUEUES__CRITICAL__CONCURRENCY=20``.
"""

from __future__ import annotations

import ipaddress
import os
from collections.abc import Callable
from dataclasses import dataclass
from decimal import Decimal
from functools import lru_cache
from pathlib import Path
from typing import Annotated, Literal

from pydantic import (
    AliasChoices,
    BaseModel,
    ByteSize,
    Field,
    SecretStr,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic_settings import BaseSettings, SettingsConfigDict

BrokerName = Literal["redis", "postgres", "inline"]


def _default_data_dir() -> Path:
    # As root, pgserver runs Postgres as its own system user and opens every
    # parent directory to it: never do that to /root, use /var/lib instead.
    if os.geteuid() == 0:
        return Path("/var/lib/conveyor")
    base = os.environ.get("XDG_DATA_HOME") or Path.home() / ".local" / "share"
    return Path(base) / "conveyor"


#: The weakest admin token accepted: a guess must not be within reach of the sign-in throttle.
MIN_ADMIN_TOKEN_LENGTH = 16
MIN_ADMIN_TOKEN_DISTINCT = 8


class QueueOverride(BaseModel):
    """Environment overrides for one queue; unset fields keep the table's value."""

    concurrency: int | None = Field(None, ge=1, le=1024)
    max_attempts: int | None = Field(None, ge=1, le=1000)
    min_backoff: float | None = Field(None, ge=0)
    max_backoff: float | None = Field(None, ge=0)
    time_limit: float | None = Field(None, gt=0)
    #: CONVEYOR_QUEUES__<QUEUE>__GROUP_CONCURRENCY: jobs of one group held at once, fleet-wide.
    group_concurrency: int | None = Field(None, ge=1, le=100_000)
    #: CONVEYOR_QUEUES__<QUEUE>__GROUP_WEIGHTS='{"vip": 3}': turns per round of named groups (1-1000, the
    #: brokers' MAX_GROUP_WEIGHT; the group names are checked with the queue). Replaces the code's whole map.
    group_weights: dict[str, Annotated[int, Field(ge=1, le=1000)]] | None = None


class BudgetOverride(BaseModel):
    """Environment overrides for one budget (``conveyor.budgets``); unset fields keep the code's value."""

    limit: float | None = Field(None, gt=0)
    per: float | None = Field(None, gt=0, le=24 * 3600)


#: How every settings class reads the environment, the library's and each blueprint's own
#: (``CONVEYOR_*``, nested with ``__``). A bad value may be a secret (a weak admin token, a provider's
#: key): errors name the field, never the value.
ENV_CONFIG = SettingsConfigDict(
    env_prefix="CONVEYOR_",
    env_nested_delimiter="__",
    extra="ignore",
    populate_by_name=True,
    hide_input_in_errors=True,
)


#: The Postgres broker's worker writes its heartbeat this many times per lease. Six leaves a worker
#: that self-fences at 0.6 of the lease (the default) more than two heartbeats' slack, so one slow
#: heartbeat on a loaded host (a starved thread, an fsync queue) does not end its process: at three,
#: a heartbeat 0.27 of the lease late did, and its jobs spent attempts on WorkerLost (soak, issue 18).
PG_HEARTBEATS_PER_LEASE = 6


@dataclass(frozen=True)
class _Lease:
    """Which settings are a broker's worker lease and its workers' heartbeat cadence."""

    lease: Callable[[Settings], float]
    cadence: Callable[[Settings], float]


class Settings(BaseSettings):
    """conveyor's configuration. ``conveyor --help`` lists every variable."""

    model_config = ENV_CONFIG

    redis_url: str | None = Field(
        None,
        validation_alias=AliasChoices("REDIS_URL", "CONVEYOR_REDIS_URL"),
        description="Redis for the redis broker.",
    )
    database_url: str | None = Field(
        None,
        validation_alias=AliasChoices("DATABASE_URL", "CONVEYOR_DATABASE_URL"),
        description="Postgres for the ledger and the postgres broker.",
    )
    database_pooled: bool = Field(
        False,
        description="DATABASE_URL goes through a transaction-mode pooler (PgBouncer): no prepared "
        "statements, no session settings (every commit then follows the server's synchronous_commit, "
        "which must be on), and no LISTEN on it (see listen_database_url).",
    )
    listen_database_url: str | None = Field(
        None,
        validation_alias=AliasChoices("LISTEN_DATABASE_URL", "CONVEYOR_LISTEN_DATABASE_URL"),
        description="A direct connection to Postgres (not through a transaction-mode pooler) for LISTEN: "
        "wake-ups of the postgres broker's workers and of stream readers. Unset with database_pooled: "
        "workers poll every pg_poll_seconds instead.",
    )
    job_failure_webhook_url: SecretStr | None = Field(
        None,
        validation_alias=AliasChoices("JOB_FAILURE_WEBHOOK_URL", "CONVEYOR_JOB_FAILURE_WEBHOOK_URL"),
        description="Chat webhook told when a job has spent its retries.",
    )
    broker: BrokerName | None = Field(
        None,
        description="redis | postgres | inline; unset: redis if REDIS_URL is set, else postgres.",
    )
    data_dir: Path = Field(
        default_factory=_default_data_dir,
        description="Where the embedded Postgres lives, and the files blueprints keep (the platform's builds).",
    )
    dedup_ttl: float = Field(24 * 3600, gt=0, description="Seconds a job key makes a second enqueue a no-op.")
    priority_aging_seconds: float = Field(
        60,
        gt=0,
        description="Seconds of waiting one priority level is worth: a priority-p job overtakes lower ones that "
        "became ready at most p x this earlier, never more (no starvation).",
    )
    result_ttl: float = Field(
        24 * 3600, gt=0, description="Seconds a job's stored result (store_result=True) is kept for readers."
    )
    heartbeat_timeout: float = Field(
        60, gt=0, description="Seconds without a heartbeat before a worker's jobs are recovered."
    )
    maintenance_interval: float = Field(
        5, gt=0, description="Seconds between a worker's recovery passes for dead workers' jobs."
    )
    shutdown_timeout: float = Field(600, ge=0, description="Seconds a stopping worker waits for in-flight jobs.")
    cancel_grace_seconds: float = Field(
        1,
        ge=0,
        le=60,
        description="Seconds a running job whose cancellation was asked has to stop by itself (it sees "
        "ctx.cancelled at once) before it is interrupted in its thread (JobCancelled).",
    )
    worker_idle_timeout: float = Field(
        1,
        ge=0.01,
        le=10,
        description="Seconds an idle worker thread or consumer waits for work before it looks again for a "
        "stop: an idle worker process takes up to about twice this to stop.",
    )
    worker_restart_backoff: float = Field(
        0.25,
        ge=0,
        le=30,
        description="Seconds before a worker process that died young (within a minute) is restarted; "
        "doubles with each such death, up to 30 s.",
    )
    rollup_flush_seconds: float = Field(
        2,
        ge=0,
        le=60,
        description="Seconds between a process's batched writes of the dashboard charts' per-minute counts "
        "(one write per process, never one per job); 0 turns the charts' history off.",
    )
    worker_max_jobs_per_process: int = Field(
        0,
        ge=0,
        description="`conveyor worker --max-jobs-per-process`: jobs a worker process starts before it is drained "
        "and replaced by a fresh one (0: never).",
    )
    worker_max_memory_per_process: ByteSize = Field(
        ByteSize(0),
        ge=0,
        description="`conveyor worker --max-memory-per-process`: resident memory (e.g. 512MiB, 1GiB) above "
        "which a worker process is drained and replaced by a fresh one (0 or empty: never).",
    )
    retention: float = Field(7 * 24 * 3600, gt=0, description="Seconds finished job records are kept.")
    event_ttl_seconds: float = Field(
        24 * 3600,
        gt=0,
        description="Seconds a signal (`app.events.signal`, `conveyor signal`) is kept for a job that starts "
        "waiting for its event later; a job waiting already is resumed at once.",
    )
    max_payload_bytes: int = Field(256 * 1024, gt=0, description="Largest encoded payload accepted at enqueue.")
    unknown_job_delay: float = Field(
        30,
        gt=0,
        description="Seconds before a job of a type this worker does not know (an older worker in a rolling "
        "deploy) is offered again; it is handed back, never attempted or failed.",
    )
    outage_retries: int = Field(
        20,
        ge=0,
        description="Times a job whose body met one of conveyor's own servers away (StoreUnavailable: the "
        "broker, the database behind the ledger, ctx.once or ctx.wait_for) is retried without spending an "
        "attempt, with the queue's backoff; past them (or with 0) such an error spends one like any other.",
    )
    pg_poll_seconds: float = Field(5, gt=0, description="Postgres broker: poll interval in case a wake-up was lost.")
    pg_enqueue_timeout: float = Field(
        30,
        gt=0,
        description="Postgres broker: seconds an enqueue waits for Postgres's answers (its whole transaction) "
        "before its connection is dropped: nothing was enqueued, or, if it was waiting for its COMMIT, the "
        "outcome is unknown (enqueue again only with a key). Bounds a reply lost behind a proxy or pooler "
        "that keeps the connection up, which no TCP timeout notices.",
    )
    pg_recovery_seconds: float = Field(
        10, gt=0, description="Postgres broker: interval of the dead-worker recovery pass."
    )
    pg_lease_seconds: float = Field(
        15,
        gt=0,
        description="Postgres broker: seconds without a heartbeat (sent every sixth of it) before a "
        "worker's jobs go back to the queue; with the recovery interval, at most 25 s by default.",
    )
    self_fence_fraction: float = Field(
        0.6,
        gt=0,
        lt=1,
        description="A worker process that has not written a heartbeat for this fraction of the lease "
        "(Postgres: pg_lease_seconds; Redis: heartbeat_timeout) exits (code 75) and is restarted, "
        "so a cut-off worker stops its jobs before recovery hands them to another. The rest of "
        "the lease must cover the watchdog's check interval and a pause (GC, swap, CPU "
        "starvation); recovery waits the full lease and then a recovery pass.",
    )
    price_per_1k_tokens: Decimal = Field(Decimal("0.002"), ge=0, description="Credits charged per 1000 tokens.")
    admin_token: SecretStr | None = Field(
        None, description="Bearer token for /admin and /api/admin; unset: those routes are closed (403)."
    )
    secret_key: SecretStr | None = Field(
        None, description="Fernet key(s) for payload secrets, comma-separated: the first encrypts, all decrypt."
    )
    imports: str = Field("", description="Comma-separated modules that register more job types.")
    path: str = Field(
        "",
        description="Directories searched first for CONVEYOR_IMPORTS, separated by os.pathsep "
        "(`conveyor worker --path DIR`); empty: the working directory.",
    )
    platform: bool = Field(
        True, description="Load the agent platform's job types and queues; false: only CONVEYOR_IMPORTS' jobs."
    )
    log_level: str = Field("INFO", description="Log level of conveyor's JSON logs.")
    otel: bool | None = Field(
        None,
        description="OpenTelemetry traces (needs the otel extra); unset: on when OTEL_EXPORTER_OTLP_ENDPOINT is set.",
    )
    otel_endpoint: str | None = Field(
        None,
        validation_alias=AliasChoices("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"),
        description="Where traces go (OTLP over HTTP, e.g. http://collector:4318); the SDK reads every other OTEL_*.",
    )
    redis_namespace: str = Field("conveyor", description="Prefix of every Redis key.")
    public_url: str | None = Field(
        None, description="Base URL of `conveyor api` as users reach it; failure alerts link to the dashboard."
    )
    webhook_format: Literal["slack", "discord", "generic"] | None = Field(
        None, description="slack | discord | generic body for JOB_FAILURE_WEBHOOK_URL; unset: guessed from the URL."
    )
    webhook_timeout: float = Field(5, gt=0, description="Seconds one failure-webhook POST may take.")
    webhook_attempts: int = Field(5, ge=1, le=20, description="POSTs per failure alert before it is given up.")
    webhook_backoff: float = Field(
        1, ge=0, description="Seconds before the second POST of an alert; doubles after each failed one."
    )
    webhook_queue_size: int = Field(
        1000, ge=1, description="Failure alerts a worker holds while the receiver is slow; more are dropped."
    )
    metrics_port: int = Field(
        9191, ge=0, le=65535, description="Port of a worker supervisor's Prometheus /metrics; 0 turns it off."
    )
    metrics_host: str = Field(
        "127.0.0.1", description="Address a worker supervisor's /metrics listens on (0.0.0.0: every interface)."
    )
    metrics_dir: Path | None = Field(
        None,
        description="Multi-process metrics directory of a worker supervisor (emptied at start); "
        "default: a new temporary directory.",
    )
    # -- schedules ----------------------------------------------------------------
    scheduler_interval: float = Field(5, gt=0, description="Seconds between the scheduler's passes over due schedules.")
    worker_schedules: bool = Field(
        True,
        description="Worker processes fire the App's cron schedules (jobs.schedule, and those added with "
        "`conveyor cron`) too, each occurrence once whatever else fires it; false: only `conveyor scheduler` does.",
    )
    scheduler_misfire_grace: float = Field(
        60, ge=0, description="Seconds late a cron fire may be and still count as on time (misfire policy 'skip')."
    )
    queues: dict[str, QueueOverride] = Field(
        default_factory=dict,
        description="Per-queue overrides: CONVEYOR_QUEUES__<QUEUE>__<FIELD>.",
    )
    budgets: dict[str, BudgetOverride] = Field(
        default_factory=dict,
        description="Per-budget overrides: CONVEYOR_BUDGETS__<NAME>__LIMIT / __PER (the budget's name, any case, "
        "dashes and dots as underscores).",
    )
    # -- redis broker client ------------------------------------------------------
    redis_socket_timeout: float = Field(
        10, gt=0, description="Redis broker: seconds a command may wait for its reply before it counts as failed."
    )
    redis_connect_timeout: float = Field(5, gt=0, description="Redis broker: seconds to open a connection.")
    redis_wait_replicas: int = Field(
        0,
        ge=0,
        description="Redis broker: after each enqueue and each claim (the write that hands out a delivery "
        "number), WAIT until this many replicas have it; 0: no WAIT (a failover may lose writes the primary "
        "acknowledged but had not replicated yet). An enqueue not acknowledged in time is reported as of "
        "unknown outcome; a claim is not started and goes back to its queue.",
    )
    redis_wait_timeout: float = Field(
        1.0, gt=0, description="Redis broker: seconds a WAIT (redis_wait_replicas) may take."
    )
    redis_health_check_interval: float = Field(
        15,
        ge=0,
        description="Redis broker: seconds a pooled connection may sit idle before it is PINGed "
        "on checkout; 0 turns the check off.",
    )
    redis_retries: int = Field(
        3,
        ge=0,
        le=20,
        description="Redis broker: reconnects with backoff a command tries before it fails "
        "(an enqueue repeats an unanswered call as often; its script recognises a repeat: docs/redis.md).",
    )
    # -- command-line defaults (each also a flag of its command) --------------------
    worker_queues: str | None = Field(
        None, description="`conveyor worker --queues`: comma-separated queues (default: all)."
    )
    worker_health_port: int = Field(
        0, ge=0, le=65535, description="`conveyor worker --health-port`: serve /livez and /healthz there; 0: none."
    )
    worker_processes: int = Field(1, description="`conveyor worker/up/demo --processes`: processes per queue.")
    worker_threads: int | None = Field(
        None, description="`conveyor worker --threads`: threads per process (default: the queue's concurrency)."
    )
    api_host: str = Field("127.0.0.1", description="`conveyor api/up --host`: the address the API listens on.")
    api_port: int = Field(8000, description="`conveyor api/up --port`: the API's port (0 in `up`: no API).")
    # -- API access and input limits -------------------------------------------
    admin_session_seconds: float = Field(
        12 * 3600, gt=0, description="Seconds a dashboard sign-in lasts; logout ends it sooner."
    )
    admin_login_attempts: int = Field(
        5, ge=1, description="Wrong admin tokens a client may try per window before sign-in answers 429."
    )
    admin_login_window: float = Field(60, gt=0, description="Seconds of the dashboard sign-in throttle's window.")
    api_max_json_bytes: int = Field(
        1024 * 1024,
        gt=0,
        description="Largest request body of a route that takes no long text (every JSON body but a "
        "resource's, and every form); a larger one answers 413. At least CONVEYOR_MAX_PAYLOAD_BYTES.",
    )
    api_max_body_bytes: int = Field(
        8 * 1024 * 1024,
        gt=0,
        description="Largest body of a route that takes a long text (PUT /api/resources/{id}); 413 above.",
    )
    api_max_json_items: int = Field(
        100_000,
        ge=100,
        description="Values (objects, arrays, items) a JSON request body may hold, which bounds the memory "
        "its parse takes; more answer 400.",
    )
    api_max_json_depth: int = Field(
        32, ge=2, le=1000, description="Deepest nesting of a JSON request body (or enqueue --batch line)."
    )
    trusted_proxies: str = Field(
        "",
        description="Comma-separated addresses or networks of the reverse proxies whose X-Forwarded-For and "
        "X-Forwarded-Proto the API believes; empty: none, the peer's address is the client's.",
    )

    @field_validator("worker_max_memory_per_process", mode="before")
    @classmethod
    def _empty_size_is_off(cls, value: object) -> object:
        return 0 if value is None or (isinstance(value, str) and not value.strip()) else value

    @field_validator("admin_token")
    @classmethod
    def _strong_admin_token(cls, value: SecretStr | None) -> SecretStr | None:
        # Never quote the value: pydantic prints the message, and this is a secret.
        if value is None or not value.get_secret_value():
            return value
        token = value.get_secret_value()
        if len(token) < MIN_ADMIN_TOKEN_LENGTH or len(set(token)) < MIN_ADMIN_TOKEN_DISTINCT:
            raise ValueError(
                f"CONVEYOR_ADMIN_TOKEN is too weak: use at least {MIN_ADMIN_TOKEN_LENGTH} random characters "
                f"with {MIN_ADMIN_TOKEN_DISTINCT} or more different ones, for example the output of "
                "`python -c 'import secrets; print(secrets.token_urlsafe(32))'`"
            )
        return value

    @field_validator("trusted_proxies")
    @classmethod
    def _proxy_networks(cls, value: str) -> str:
        for entry in (part.strip() for part in value.split(",")):
            if entry:
                try:
                    ipaddress.ip_network(entry, strict=False)
                except ValueError:
                    raise ValueError(
                        "CONVEYOR_TRUSTED_PROXIES: each entry is an IP address or network (10.0.0.0/8)"
                    ) from None
        return ",".join(part.strip() for part in value.split(",") if part.strip())

    @model_validator(mode="after")
    def _payload_fits_a_request(self) -> "Settings":
        if self.api_max_json_bytes < self.max_payload_bytes:
            raise ValueError(
                "api_max_json_bytes: a request body may hold a whole payload, so it must be at least "
                f"CONVEYOR_MAX_PAYLOAD_BYTES ({self.max_payload_bytes})"
            )
        return self

    # Which queues exist is known to the blueprints that declare them, not here (settings imports
    # nothing from conveyor): the App checks the names once it loaded them (conveyor.tasks.queues.queue_specs).
    @field_validator("queues")
    @classmethod
    def _lower_queue_names(cls, value: dict[str, QueueOverride]) -> dict[str, QueueOverride]:
        return {name.lower(): override for name, override in value.items()}

    @model_validator(mode="after")
    def _self_fence_before_recovery(self) -> "Settings":
        """The self-fence must fire after a missed heartbeat or two, and well before recovery can act.

        A worker's jobs can be handed out no earlier than a full lease after
        its last heartbeat reached the server; the worker exits at most
        threshold + check interval after it. What is left of the lease is the
        margin for a pause. And the threshold must outlast the heartbeat's own
        cadence, or a healthy worker would fence itself.
        """
        lease_of = _LEASES[self.broker_name]
        if lease_of is None:
            return self
        lease, threshold = self.worker_lease, self.self_fence_threshold
        if lease - threshold < self.self_fence_interval + self.self_fence_margin:
            raise ValueError(
                f"self_fence_fraction: a worker exits {threshold:.2f}s after its last heartbeat, too close to "
                f"the {lease:.2f}s lease (needs {self.self_fence_interval + self.self_fence_margin:.2f}s "
                "to spare): lower it or lengthen the lease"
            )
        cadence = lease_of.cadence(self)
        if threshold < 1.5 * cadence:
            raise ValueError(
                f"self_fence_fraction: a worker would exit {threshold:.2f}s after its last heartbeat but "
                f"heartbeats only every {cadence:.2f}s: raise it, or shorten maintenance_interval (Redis)"
            )
        return self

    @property
    def worker_lease(self) -> float:
        """Seconds without a heartbeat after which the broker in use hands a worker's jobs to others."""
        lease_of = _LEASES[self.broker_name]
        return self.heartbeat_timeout if lease_of is None else lease_of.lease(self)

    @property
    def self_fence_threshold(self) -> float:
        """Seconds without a heartbeat after which a worker process exits (see ``self_fence_fraction``)."""
        return self.self_fence_fraction * self.worker_lease

    @property
    def self_fence_interval(self) -> float:
        """How often the worker's watchdog looks at its heartbeat's age."""
        return min(0.5, self.worker_lease / 20)

    @property
    def self_fence_margin(self) -> float:
        """What the lease must keep beyond threshold + check interval: a GC pause, a starved CPU."""
        return max(0.2, self.worker_lease / 10)

    @property
    def broker_name(self) -> BrokerName:
        """The broker in use: explicit, else redis when REDIS_URL is set, else postgres."""
        if self.broker:
            return self.broker
        return "redis" if self.redis_url else "postgres"

    @property
    def tracing(self) -> bool:
        """OpenTelemetry on: CONVEYOR_OTEL, else whether an OTLP endpoint is configured."""
        return self.otel if self.otel is not None else bool(self.otel_endpoint)

    @property
    def import_modules(self) -> list[str]:
        return [m.strip() for m in self.imports.split(",") if m.strip()]

    @property
    def import_paths(self) -> list[str]:
        """CONVEYOR_PATH's directories, absolute; the working directory when it names none."""
        import os

        return [os.path.abspath(p) for p in self.path.split(os.pathsep) if p.strip()] or [os.getcwd()]

    @property
    def embedded(self) -> bool:
        """True when no database is configured and the embedded Postgres is used."""
        return self.database_url is None


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    """The process's settings, read once from the environment."""
    return Settings()


def env_help(model: type[BaseSettings] = Settings) -> list[tuple[str, str]]:
    """(variable, description) pairs of ``model``'s fields for ``--help``, each description ending with its
    default when it has one. Any settings class of the library's shape (a blueprint's own: ``jobs.add_settings``)."""
    prefix = model.model_config.get("env_prefix") or ""
    rows = []
    for name, field in model.model_fields.items():
        alias = field.validation_alias
        first = alias.choices[0] if isinstance(alias, AliasChoices) else None
        env = first if isinstance(first, str) else f"{prefix}{name}".upper()
        text = field.description or ""
        default = field.get_default(call_default_factory=True)
        if default not in (None, "", {}, []) and not isinstance(default, SecretStr):
            text += f" [default: {_plain(default)}]"
        rows.append((env, text))
    return rows


def variable_of(model: type[BaseSettings], loc: tuple[int | str, ...]) -> str:
    """The environment variable behind an error's location in ``model`` (``CONVEYOR_PROVIDER``), else the location."""
    if not loc or not isinstance(loc[0], str) or loc[0] not in model.model_fields:
        return ".".join(map(str, loc)) or "settings"
    alias = model.model_fields[loc[0]].validation_alias
    first = alias.choices[0] if isinstance(alias, AliasChoices) else None
    prefix = model.model_config.get("env_prefix") or ""
    head = first if isinstance(first, str) else f"{prefix}{loc[0]}".upper()
    return "__".join([head, *(str(part).upper() for part in loc[1:])])


def describe_invalid(model: type[BaseSettings], exc: ValidationError) -> str:
    """One line naming each bad variable and what is wrong with it, never its value (``hide_input_in_errors``)."""
    return "; ".join(f"{variable_of(model, tuple(e['loc']))}: {e['msg']}" for e in exc.errors())


def _plain(value: object) -> str:
    """A default as one would write it in the environment: ``true``, ``5``, ``0.25``, a path."""
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


#: Per broker, the settings its lease and heartbeat come from: the one place a broker's name picks
#: settings. None: the broker hands nothing out again (inline), so there is no lease to keep and no
#: self-fence to check; its workers still read ``heartbeat_timeout`` as their lease.
_LEASES: dict[BrokerName, _Lease | None] = {
    "redis": _Lease(lease=lambda s: s.heartbeat_timeout, cadence=lambda s: s.maintenance_interval),
    "postgres": _Lease(
        lease=lambda s: s.pg_lease_seconds, cadence=lambda s: s.pg_lease_seconds / PG_HEARTBEATS_PER_LEASE
    ),
    "inline": None,
}
