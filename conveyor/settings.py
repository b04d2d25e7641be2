"""The one settings object: everything conveyor reads from the environment.

Service URLs keep the names every platform already uses (``REDIS_URL``,
``DATABASE_URL``, ``JOB_FAILURE_WEBHOOK_URL``); everything else is
``CONVEYOR_*``. Per-queue overrides use a double underscore, for example
``CONVEYOR_QUEUES__CRITICAL__CONCURRENCY=20``.
"""

from __future__ import annotations

import os
from decimal import Decimal
from functools import lru_cache
from pathlib import Path
from typing import Literal

from pydantic import AliasChoices, BaseModel, Field, SecretStr, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

BrokerName = Literal["redis", "postgres", "inline"]


def _default_data_dir() -> Path:
    # As root, pgserver runs Postgres as its own system user and opens every
    # parent directory to it: never do that to /root, use /var/lib instead.
    if os.geteuid() == 0:
        return Path("/var/lib/conveyor")
    base = os.environ.get("XDG_DATA_HOME") or Path.home() / ".local" / "share"
    return Path(base) / "conveyor"


class QueueOverride(BaseModel):
    """Environment overrides for one queue; unset fields keep the table's value."""

    concurrency: int | None = Field(None, ge=1, le=1024)
    max_attempts: int | None = Field(None, ge=1, le=1000)
    min_backoff: float | None = Field(None, ge=0)
    max_backoff: float | None = Field(None, ge=0)
    time_limit: float | None = Field(None, gt=0)


class Settings(BaseSettings):
    """conveyor's configuration. ``conveyor --help`` lists every variable."""

    model_config = SettingsConfigDict(
        env_prefix="CONVEYOR_",
        env_nested_delimiter="__",
        extra="ignore",
        populate_by_name=True,
    )

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
        description="Where the embedded Postgres keeps its data.",
    )
    dedup_ttl: float = Field(
        24 * 3600, gt=0, description="Seconds a job key makes a second enqueue a no-op."
    )
    heartbeat_timeout: float = Field(
        60, gt=0, description="Seconds without a heartbeat before a worker's jobs are recovered."
    )
    maintenance_interval: float = Field(
        5, gt=0, description="Seconds between a worker's recovery passes for dead workers' jobs."
    )
    shutdown_timeout: float = Field(
        600, ge=0, description="Seconds a stopping worker waits for in-flight jobs."
    )
    retention: float = Field(
        7 * 24 * 3600, gt=0, description="Seconds finished job records are kept."
    )
    max_payload_bytes: int = Field(
        256 * 1024, gt=0, description="Largest encoded payload accepted at enqueue."
    )
    pg_poll_seconds: float = Field(
        5, gt=0, description="Postgres broker: poll interval in case a wake-up was lost."
    )
    pg_recovery_seconds: float = Field(
        10, gt=0, description="Postgres broker: interval of the dead-worker recovery pass."
    )
    pg_lease_seconds: float = Field(
        15, gt=0,
        description="Postgres broker: seconds without a heartbeat (sent every third of it) before a "
                    "worker's jobs go back to the queue; with the recovery interval, at most 25 s by default.",
    )
    price_per_1k_tokens: Decimal = Field(
        Decimal("0.002"), ge=0, description="Credits charged per 1000 tokens."
    )
    admin_token: SecretStr | None = Field(None, description="Bearer token for /admin routes.")
    secret_key: SecretStr | None = Field(None, description="Fernet key(s) for payload secrets.")
    imports: str = Field("", description="Comma-separated modules that register more job types.")
    log_level: str = Field("INFO", description="Log level of conveyor's JSON logs.")
    redis_namespace: str = Field("conveyor", description="Prefix of every Redis key.")
    queues: dict[str, QueueOverride] = Field(
        default_factory=dict,
        description="Per-queue overrides: CONVEYOR_QUEUES__<QUEUE>__<FIELD>.",
    )

    @field_validator("queues")
    @classmethod
    def _known_queues(cls, value: dict[str, QueueOverride]) -> dict[str, QueueOverride]:
        from .tasks.queues import QUEUES

        value = {name.lower(): override for name, override in value.items()}
        unknown = sorted(set(value) - set(QUEUES))
        if unknown:
            raise ValueError(f"unknown queue(s) {unknown}; known: {sorted(QUEUES)}")
        return value

    @property
    def broker_name(self) -> BrokerName:
        """The broker in use: explicit, else redis when REDIS_URL is set, else postgres."""
        if self.broker:
            return self.broker
        return "redis" if self.redis_url else "postgres"

    @property
    def import_modules(self) -> list[str]:
        return [m.strip() for m in self.imports.split(",") if m.strip()]

    @property
    def embedded(self) -> bool:
        """True when no database is configured and the embedded Postgres is used."""
        return self.database_url is None


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    """The process's settings, read once from the environment."""
    return Settings()


def env_help() -> list[tuple[str, str]]:
    """(variable, description) pairs for ``--help``."""
    rows = []
    for name, field in Settings.model_fields.items():
        alias = field.validation_alias
        env = alias.choices[0] if isinstance(alias, AliasChoices) else f"CONVEYOR_{name.upper()}"
        rows.append((env, field.description or ""))
    return rows
