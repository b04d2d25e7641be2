"""The agent platform's settings: its model provider, llm limits, streams, per-user quotas, builds and demo.

They travel with the platform's blueprint (``jobs.add_settings``): an App that includes it reads them
from the environment when it is built, under the same ``CONVEYOR_*`` names as ever, and refuses to
start on a bad one (one line naming the variable, never its value); an App without the platform
neither reads nor checks them. The platform's code reaches them through its App:
``platform_settings(app)``. ``conveyor --help`` lists them under the platform's heading.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Literal

from pydantic import Field, SecretStr, ValidationError, field_validator
from pydantic_settings import BaseSettings

from conveyor.errors import ConfigurationError
from conveyor.settings import ENV_CONFIG, describe_invalid

if TYPE_CHECKING:
    from conveyor.app import App

ProviderName = Literal["local", "openai"]


class PlatformSettings(BaseSettings):
    """The agent platform's configuration (``conveyor --help`` lists every variable)."""

    model_config = ENV_CONFIG

    # -- builds ------------------------------------------------------------
    build_heartbeat_interval: float = Field(
        10, gt=0, description="Seconds between a running build's heartbeats (builds.heartbeat_at)."
    )
    build_stale_after: float = Field(
        60, gt=0, description="Seconds without a heartbeat before a build may be taken over by another worker."
    )
    build_time_limits: dict[str, float] = Field(
        default_factory=dict,
        description="Per build kind time limit overrides, seconds: CONVEYOR_BUILD_TIME_LIMITS__<KIND>.",
    )
    build_source_roots: str = Field(
        "",
        description="Comma-separated host directories builds may take archives, directories and git "
        "repositories from (Python/CLI producers only; HTTP takes uploads); empty: uploads only.",
    )
    build_max_source_bytes: int = Field(
        2 * 1024**3, gt=0, description="Bytes a build's source tree may hold: unpacked, copied or packaged."
    )
    build_max_source_files: int = Field(
        100_000, gt=0, description="Files and directories a build's source tree may hold."
    )
    upload_max_bytes: int = Field(
        100 * 1024**2, gt=0, description="Largest archive POST /api/agents/upload-and-deploy accepts (413 above)."
    )
    build_cpu_seconds: int = Field(600, gt=0, description="CPU seconds each build-script process may use.")
    build_memory_bytes: int = Field(
        2 * 1024**3,
        gt=0,
        description="Memory one build may use, bytes: all its processes, its workspace and its /tmp together "
        "(its memory cgroup); also the address space each of its processes may map.",
    )
    build_max_processes: int = Field(
        256, gt=0, description="Processes one build may run at once, its whole tree (its pids cgroup)."
    )
    build_cpus: float = Field(1.0, gt=0, description="CPU cores one build may use at once (its cpu cgroup's quota).")
    build_workspace_bytes: int = Field(
        1024**3,
        gt=0,
        description="Size of a build's workspace (a tmpfs in its sandbox, counted in its memory): past it the "
        "script gets ENOSPC.",
    )
    build_isolation: Literal["cgroup", "rlimits-only"] = Field(
        "cgroup",
        description="cgroup: one cgroup per build (memory, processes, CPU), builds refused where the worker "
        "cannot make one; rlimits-only: per-process limits only, processes counted per sandbox user "
        "(builds on one worker can starve each other).",
    )
    build_max_file_bytes: int = Field(1024**3, gt=0, description="Largest file a build script may write, bytes.")
    build_tmp_bytes: int = Field(256 * 1024**2, gt=0, description="Size of a build script's private /tmp, bytes.")
    build_network: bool = Field(
        False, description="Give build scripts the host's network; off: a network namespace with loopback only."
    )
    build_sandbox_uids: str = Field(
        "2100000000-2100065535",
        pattern=r"^$|^[1-9][0-9]{0,9}-[1-9][0-9]{0,9}$",
        description="FIRST-LAST: under a root worker each running build gets its own uid (and gid) from this "
        "range, so what the kernel counts per user is its own; empty: every build runs as "
        "CONVEYOR_BUILD_SANDBOX_UID.",
    )
    build_sandbox_uid: int = Field(
        65534,
        ge=1,
        description="User every build script runs as under a root worker when CONVEYOR_BUILD_SANDBOX_UIDS is empty "
        "(nobody).",
    )
    build_sandbox_gid: int = Field(65534, ge=1, description="Its group.")
    # -- agent platform ---------------------------------------------------------
    provider: ProviderName = Field(
        "local", description="Model provider: local (deterministic, no network) | openai (OpenAI-compatible HTTP)."
    )
    openai_base_url: str = Field(
        "https://api.openai.com/v1", description="openai provider: base URL of the chat-completions API."
    )
    openai_api_key: SecretStr | None = Field(None, description="openai provider: API key (never logged).")
    openai_model: str = Field("gpt-4o-mini", description="openai provider: model name.")
    provider_timeout: float = Field(60, gt=0, description="Seconds the HTTP provider waits for a response or chunk.")
    provider_retry_after: float = Field(5, gt=0, description="Seconds to wait after a 429 that names no Retry-After.")
    local_chunk_delay: float = Field(
        0, ge=0, le=10, description="local provider: seconds between streamed chunks (simulates a model)."
    )
    llm_global_concurrency: int = Field(
        2, ge=1, le=1000, description="llm queue: jobs running at once across every worker (fleet-wide)."
    )
    llm_slot_lease: float = Field(
        30, gt=0, description="Seconds an llm slot outlives a worker that died holding it (Redis deployments)."
    )
    provider_rate_limit: int = Field(
        0, ge=0, description="Provider requests allowed per window by llm jobs; 0: unlimited."
    )
    provider_rate_window: float = Field(60, gt=0, description="Seconds of the provider rate-limit window.")
    stream_retention: float = Field(
        24 * 3600, gt=0, description="Seconds a run's streamed chunks are kept in Redis after the last one."
    )
    # -- per-user quotas of the producer API (429 past each) ------------------------
    user_max_active_runs: int = Field(
        10, ge=1, description="Runs a user may have queued or running at once; one more answers 429."
    )
    user_max_streams: int = Field(20, ge=1, description="SSE streams a user may hold open at once (429 past it).")
    user_max_stream_bytes: int = Field(
        64 * 1024 * 1024,
        ge=1,
        description="Bytes of streamed text of a user's runs kept (those ended within CONVEYOR_STREAM_RETENTION); "
        "at or past it, a new run answers 429.",
    )
    user_stream_lease: float = Field(
        60,
        gt=0,
        description="Seconds an open stream's place in CONVEYOR_USER_MAX_STREAMS outlives an API process that "
        "died holding it (renewed every third of it while the stream is open).",
    )
    fault_rate: float = Field(
        0, ge=0, le=1, description="Share of first attempts of platform jobs that fail on purpose (demo/chaos)."
    )
    # -- `conveyor demo` defaults (each also a flag of the command) ----------
    demo_runs: int = Field(20, description="`conveyor demo --runs`: agent rounds to run.")
    demo_duplicates: int | None = Field(
        None, description="`conveyor demo --duplicates`: rounds given two extra finalizes (default: a quarter)."
    )
    demo_timeout: float = Field(100, description="`conveyor demo --timeout`: seconds before the demo gives up.")

    @field_validator("build_time_limits")
    @classmethod
    def _positive_build_limits(cls, value: dict[str, float]) -> dict[str, float]:
        value = {kind.lower(): limit for kind, limit in value.items()}
        bad = sorted(kind for kind, limit in value.items() if limit <= 0)
        if bad:
            raise ValueError(f"build time limits must be positive: {bad}")
        return value

    @field_validator("build_sandbox_uids")
    @classmethod
    def _uid_range(cls, value: str) -> str:
        if value:
            first, last = (int(n) for n in value.split("-"))
            if not 1 <= first <= last < 2**31 - 1:
                raise ValueError("give FIRST-LAST with 1 <= FIRST <= LAST < 2147483647")
        return value

    @property
    def sandbox_uid_range(self) -> tuple[int, int] | None:
        """(first, last) of CONVEYOR_BUILD_SANDBOX_UIDS, or None when every build runs as one user."""
        if not self.build_sandbox_uids:
            return None
        first, last = (int(n) for n in self.build_sandbox_uids.split("-"))
        return first, last

    @property
    def source_roots(self) -> list[Path]:
        """The resolved build source roots (CONVEYOR_BUILD_SOURCE_ROOTS)."""
        return [Path(p.strip()).expanduser().resolve() for p in self.build_source_roots.split(",") if p.strip()]


def from_environment() -> PlatformSettings:
    """The platform's settings read from the environment; a bad variable is a
    :class:`~conveyor.errors.ConfigurationError` naming it, never its value (as an App's)."""
    try:
        return PlatformSettings()
    except ValidationError as exc:
        raise ConfigurationError(f"invalid settings: {describe_invalid(PlatformSettings, exc)}") from None


def platform_settings(app: App) -> PlatformSettings:
    """The platform's settings of ``app``: those it was built with, else read from the environment once."""
    return app.settings_of(PlatformSettings)
