"""The agent.build payload: a tagged union on ``kind``, one model per build variant.

Every variant carries the build's id (its row in ``builds``), the owner, and
``env``: variables for the build, each value encrypted with
:func:`conveyor.secrets.encrypt_env` before enqueue (plain values are refused).
A field added to a variant later gets a default, so messages enqueued before
it still load; fields a newer producer added are ignored at run time.

Each variant declares its own ``time_limit``; the job's Dramatiq time limit is
:data:`HARD_TIME_LIMIT`, the longest of them plus a margin, and the processor
enforces the variant's own limit inside (``CONVEYOR_BUILD_TIME_LIMITS__<KIND>``
may shorten one).
"""

from __future__ import annotations

import typing
from pathlib import PurePosixPath
from typing import Annotated, Any, ClassVar, Literal, Union

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    RootModel,
    StringConstraints,
    field_validator,
    model_validator,
)

from conveyor.platform.builds.envnames import unsafe_names
from conveyor.platform.builds.paths import SafeName
from conveyor.platform.builds.uploads import UploadId
from conveyor.secrets import looks_encrypted
from conveyor.tasks.payloads import Id

#: A version label: v3, 1.4.0, git-0a1b2c3d4e5f.
Version = Annotated[str, StringConstraints(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9][A-Za-z0-9._+\-]*$")]

#: An environment variable name.
EnvName = Annotated[str, StringConstraints(min_length=1, max_length=128, pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")]

MINUTE = 60.0


def _absolute(path: str) -> str:
    if not PurePosixPath(path).is_absolute():
        raise ValueError("must be an absolute path")
    return path


#: A file or directory on the build host (or a volume every worker shares), under CONVEYOR_BUILD_SOURCE_ROOTS.
AbsPath = Annotated[str, StringConstraints(min_length=1, max_length=4096), AfterValidator(_absolute)]


class BuildVariant(BaseModel):
    """What every build variant carries."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    #: Seconds this kind may run; enforced by the processor.
    time_limit: ClassVar[float]
    #: True when a successful build points the target's deployment at its version.
    deploys: ClassVar[bool] = True
    #: ``agent`` or ``connector``: which table the target lives in.
    target_kind: ClassVar[str] = "agent"

    #: Becomes the name of the build's workspace directory: no dots, no slashes.
    build_id: SafeName
    owner_id: Id
    env: dict[EnvName, str] = Field(default_factory=dict, max_length=200)

    @field_validator("env")
    @classmethod
    def _safe_names(cls, env: dict[str, str]) -> dict[str, str]:
        refused = unsafe_names(env)
        if refused:
            # The names are the request's own; the values are never quoted.
            raise ValueError(
                f"{', '.join(refused)}: variables that steer the dynamic loader or the C library are not accepted"
            )
        return env

    @field_validator("env")
    @classmethod
    def _encrypted(cls, env: dict[str, str]) -> dict[str, str]:
        plain = sorted(name for name, value in env.items() if not looks_encrypted(value))
        if plain:
            # Name the variables, never the values.
            raise ValueError(f"values of {plain} are not encrypted: use conveyor.secrets.encrypt_env before enqueue")
        return env

    @property
    def target_id(self) -> str:
        """The id of the agent or connector this build is for."""
        target_id: str = getattr(self, "agent_id")  # every variant but McpUpload (which overrides this) has one
        return target_id

    def host_paths(self) -> list[str]:
        """The fields of this request that name a path on the build host (producers over HTTP may not)."""
        found = [name for name in ("archive_path", "source_dir") if getattr(self, name, None)]
        for name in ("git_url", "repo_url"):
            url = getattr(self, name, None)
            if url and not is_remote_url(url):
                found.append(name)
        return found


def is_remote_url(url: str) -> bool:
    """True for a git URL on another host (https, ssh, git, or user@host:path); False for a path or file://."""
    if "://" in url:
        return not url.startswith("file://")
    return not url.startswith("/") and ":" in url.split("/", 1)[0]


class Upload(BuildVariant):
    """A new agent uploaded as an archive (.zip, .tar, .tar.gz): build it and deploy it."""

    time_limit: ClassVar[float] = 15 * MINUTE

    kind: Literal["upload"] = "upload"
    agent_id: Id
    #: An archive stored by POST /api/agents/upload-and-deploy.
    upload_id: UploadId | None = None
    archive_path: AbsPath | None = None
    version: Version | None = None

    @model_validator(mode="after")
    def _one_source(self) -> "Upload":
        if (self.upload_id is None) == (self.archive_path is None):
            raise ValueError("give exactly one of upload_id and archive_path")
        return self


class Update(BuildVariant):
    """A new version of an existing agent, from an archive, a directory, or (neither given) its repository again."""

    time_limit: ClassVar[float] = 15 * MINUTE

    kind: Literal["update"] = "update"
    agent_id: Id
    upload_id: UploadId | None = None
    archive_path: AbsPath | None = None
    source_dir: AbsPath | None = None
    new_version: Version | None = None
    #: Added after the first release: updates enqueued before it load with "".
    changelog: str = Field("", max_length=4000)

    @model_validator(mode="after")
    def _one_source(self) -> "Update":
        if sum(1 for v in (self.upload_id, self.archive_path, self.source_dir) if v) > 1:
            raise ValueError(
                "give one of upload_id, archive_path and source_dir (none: rebuild from the agent's repository)"
            )
        return self


class Rollback(BuildVariant):
    """Point an agent's deployment back at a version it was built as before."""

    time_limit: ClassVar[float] = 2 * MINUTE

    kind: Literal["rollback"] = "rollback"
    agent_id: Id
    target_version: Version
    reason: str = Field("", max_length=2000)


class StandaloneBuild(BuildVariant):
    """Build a version from a git repository or a directory without deploying it."""

    time_limit: ClassVar[float] = 30 * MINUTE
    deploys: ClassVar[bool] = False

    kind: Literal["standalone_build"] = "standalone_build"
    agent_id: Id
    git_url: str | None = None
    source_dir: AbsPath | None = None
    ref: str | None = Field(None, max_length=255)
    version_tag: Version | None = None

    @model_validator(mode="after")
    def _one_source(self) -> "StandaloneBuild":
        if (self.git_url is None) == (self.source_dir is None):
            raise ValueError("give exactly one of git_url and source_dir")
        return self


class GithubClone(BuildVariant):
    """Clone an agent's repository (a branch, or the default one), build and deploy it."""

    time_limit: ClassVar[float] = 30 * MINUTE

    kind: Literal["github_clone"] = "github_clone"
    agent_id: Id
    repo_url: str = Field(min_length=1, max_length=2000)
    branch: str | None = Field(None, max_length=255)
    version_override: Version | None = None


class McpArchive(BaseModel):
    """An MCP server uploaded as an archive."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    type: Literal["archive"] = "archive"
    path: AbsPath


class McpUploaded(BaseModel):
    """An MCP server uploaded through the upload route."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    type: Literal["upload"] = "upload"
    upload_id: UploadId


class McpGit(BaseModel):
    """An MCP server in a git repository."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    type: Literal["git"] = "git"
    url: str = Field(min_length=1, max_length=2000)
    ref: str | None = Field(None, max_length=255)


McpSource = Annotated[Union[McpArchive, McpUploaded, McpGit], Field(discriminator="type")]


class McpUpload(BuildVariant):
    """An MCP server for a connector, from an archive or a repository: build it and deploy it."""

    time_limit: ClassVar[float] = 15 * MINUTE
    target_kind: ClassVar[str] = "connector"

    kind: Literal["mcp_upload"] = "mcp_upload"
    connector_id: Id
    source: McpSource
    version: Version | None = None

    @property
    def target_id(self) -> str:
        return self.connector_id

    def host_paths(self) -> list[str]:
        src = self.source
        if isinstance(src, McpArchive) or (isinstance(src, McpGit) and not is_remote_url(src.url)):
            return [f"source.{'path' if isinstance(src, McpArchive) else 'url'}"]
        return []


#: Any one build request. A new variant is added here (and gets an executor).
Variant = Union[Upload, Update, Rollback, StandaloneBuild, GithubClone, McpUpload]

#: The variants, in the order of the union (spelled once, above, so mypy sees the union too).
VARIANTS: tuple[type[BuildVariant], ...] = typing.get_args(Variant)

BUILD_KINDS: dict[str, type[BuildVariant]] = {v.model_fields["kind"].default: v for v in VARIANTS}

BuildRequest = Annotated[Variant, Field(discriminator="kind")]

#: The job's Dramatiq time limit: the longest variant's, plus time to write the outcome.
HARD_TIME_LIMIT = max(v.time_limit for v in VARIANTS) + 5 * MINUTE


class BuildPayload(RootModel[BuildRequest]):
    """agent.build's payload: ``{"kind": "upload", "build_id": ..., ...}``; the variant is ``.root``."""

    model_config = ConfigDict(frozen=True)

    #: Redacted wherever payloads are shown (dashboard, webhooks, API).
    secret_fields: ClassVar[frozenset[str]] = frozenset({"env"})

    @classmethod
    def load(cls, data: Any) -> "BuildPayload":
        """Validate a payload read back from a queue, ignoring fields this version does not know."""
        if isinstance(data, dict) and data.get("kind") in BUILD_KINDS:
            data = _known_fields(BUILD_KINDS[data["kind"]], data)
        return cls.model_validate(data)


def _known_fields(model: type[BaseModel], data: dict[str, Any]) -> dict[str, Any]:
    """``data`` without the keys ``model`` (and its nested models) does not declare."""
    out = {}
    for name, value in data.items():
        field = model.model_fields.get(name)
        if field is None:
            continue
        if isinstance(value, dict):
            nested = _nested_model(field.annotation, field.discriminator, value)
            if nested is not None:
                value = _known_fields(nested, value)
        out[name] = value
    return out


def _nested_model(annotation: Any, discriminator: Any, value: dict[str, Any]) -> type[BaseModel] | None:
    candidates = [
        a for a in (typing.get_args(annotation) or (annotation,)) if isinstance(a, type) and issubclass(a, BaseModel)
    ]
    if len(candidates) == 1:
        return candidates[0]
    if isinstance(discriminator, str):
        for candidate in candidates:
            if candidate.model_fields[discriminator].default == value.get(discriminator):
                return candidate
    return None
