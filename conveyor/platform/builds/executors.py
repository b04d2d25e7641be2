"""One executor per build kind: what that variant does, through the builder and the store.

An executor gets a :class:`BuildContext` and returns an
:class:`~conveyor.platform.builds.store.Outcome`; the agent.build processor claims,
heartbeats, enforces the time limit, records the outcome and reads it back.
Adding a variant is a payload model plus one ``@executor`` function here.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from conveyor.platform.builds import store
from conveyor.platform.builds.builder import (
    ArchiveSource,
    Builder,
    BuildLog,
    Deadline,
    DirectorySource,
    GitSource,
    Source,
    UploadSource,
)
from conveyor.platform.builds.payloads import (
    BuildVariant,
    GithubClone,
    McpGit,
    McpUpload,
    McpUploaded,
    Rollback,
    StandaloneBuild,
    Update,
    Upload,
)
from conveyor.platform.builds.store import Outcome
from conveyor.platform.errors import BuildFailed

if TYPE_CHECKING:
    from psycopg_pool import ConnectionPool

#: The variant a context carries: each executor takes the context of its own kind's request.
R = TypeVar("R", bound=BuildVariant)


@dataclass(frozen=True)
class BuildContext(Generic[R]):
    """Everything an executor may use. ``env`` holds the decrypted values: pass it on, never log it."""

    request: R
    builder: Builder
    pool: ConnectionPool
    env: dict[str, str]
    deadline: Deadline
    log: BuildLog
    workdir: Path


#: What runs one kind; the processor picks it by the request's ``kind``, so the request is that kind's variant.
Executor = Callable[[BuildContext[Any]], Outcome]

#: kind -> executor.
EXECUTORS: dict[str, Executor] = {}


def executor(kind: str) -> Callable[[Callable[[BuildContext[R]], Outcome]], Callable[[BuildContext[R]], Outcome]]:
    """Register the decorated function as the executor of build kind ``kind``."""

    def register(fn: Callable[[BuildContext[R]], Outcome]) -> Callable[[BuildContext[R]], Outcome]:
        EXECUTORS[kind] = fn
        return fn

    return register


def _git_version(commit: str | None) -> str | None:
    """The version a build from git gets when none is given: ``git-<commit[:12]>``."""
    return f"git-{commit[:12]}" if commit else None


def build_source(ctx: BuildContext[Any], source: Source) -> tuple[str, str | None]:
    """Fetch, build and package ``source``: (artifact sha256, git commit or None)."""
    tree = ctx.workdir / "src"
    commit = ctx.builder.fetch(source, tree, ctx.deadline, ctx.log)
    ctx.builder.run_build_script(tree, ctx.env, ctx.deadline, ctx.log)
    artifact = ctx.builder.package(tree, ctx.deadline, ctx.log)
    return artifact.sha256, commit


@executor("upload")
def upload(ctx: BuildContext[Upload]) -> Outcome:
    request = ctx.request
    source: Source
    if request.upload_id:
        source = UploadSource(request.upload_id)
    else:
        assert request.archive_path is not None, "Upload holds exactly one of upload_id and archive_path"
        source = ArchiveSource(request.archive_path)
    artifact, _ = build_source(ctx, source)
    return Outcome(artifact, request.version, env_names=tuple(sorted(ctx.env)))


@executor("update")
def update(ctx: BuildContext[Update]) -> Outcome:
    request = ctx.request
    if request.upload_id:
        source: Source = UploadSource(request.upload_id)
    elif request.archive_path:
        source = ArchiveSource(request.archive_path)
    elif request.source_dir:
        source = DirectorySource(request.source_dir)
    else:
        with ctx.pool.connection() as conn:
            agent = store.get_target(conn, "agent", request.agent_id)
        if agent is None or not agent.repo_url:
            raise BuildFailed(f"agent {request.agent_id} has no repository to rebuild from; give upload_id")
        source = GitSource(agent.repo_url, agent.repo_branch)
    if request.changelog:
        ctx.log.write(f"changelog: {request.changelog}")
    artifact, _ = build_source(ctx, source)
    return Outcome(artifact, request.new_version, env_names=tuple(sorted(ctx.env)))


@executor("rollback")
def rollback(ctx: BuildContext[Rollback]) -> Outcome:
    request = ctx.request
    with ctx.pool.connection() as conn:
        found = store.get_version(conn, "agent", request.agent_id, request.target_version)
        known = [v for v, _ in store.list_versions(conn, "agent", request.agent_id)]
        deployed = store.get_deployment(conn, "agent", request.agent_id)
    if found is None:
        raise BuildFailed(
            f"agent {request.agent_id} has no version {request.target_version} (versions: {', '.join(known) or 'none'})"
        )
    version, artifact = found
    if ctx.builder.artifact(artifact) is None:
        raise BuildFailed(f"the artifact of {request.agent_id} {version} (sha256:{artifact}) is gone")
    ctx.log.write(
        f"rolling back from {deployed.version if deployed else 'nothing'} to {version}"
        + (f": {request.reason}" if request.reason else "")
    )
    return Outcome(artifact, version, new_version=False)


@executor("standalone_build")
def standalone_build(ctx: BuildContext[StandaloneBuild]) -> Outcome:
    request = ctx.request
    source: Source
    if request.git_url:
        source = GitSource(request.git_url, request.ref)
    else:
        assert request.source_dir is not None, "StandaloneBuild holds exactly one of git_url and source_dir"
        source = DirectorySource(request.source_dir)
    artifact, commit = build_source(ctx, source)
    version = request.version_tag or _git_version(commit)
    return Outcome(artifact, version, env_names=tuple(sorted(ctx.env)))


@executor("github_clone")
def github_clone(ctx: BuildContext[GithubClone]) -> Outcome:
    request = ctx.request
    artifact, commit = build_source(ctx, GitSource(request.repo_url, request.branch))
    return Outcome(
        artifact,
        request.version_override or _git_version(commit),
        env_names=tuple(sorted(ctx.env)),
        repo_url=request.repo_url,
        repo_branch=request.branch,
    )


@executor("mcp_upload")
def mcp_upload(ctx: BuildContext[McpUpload]) -> Outcome:
    request = ctx.request
    src = request.source
    source: Source
    repo_url = repo_branch = None
    if isinstance(src, McpUploaded):
        source = UploadSource(src.upload_id)
    elif isinstance(src, McpGit):
        source = GitSource(src.url, src.ref)
        repo_url, repo_branch = src.url, src.ref
    else:
        source = ArchiveSource(src.path)
    artifact, commit = build_source(ctx, source)
    version = request.version or _git_version(commit)
    return Outcome(
        artifact,
        version,
        env_names=tuple(sorted(ctx.env)),
        repo_url=repo_url,
        repo_branch=repo_branch,
    )
