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

from psycopg_pool import ConnectionPool

from conveyor.errors import BuildFailed
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


@dataclass(frozen=True)
class BuildContext:
    """Everything an executor may use. ``env`` holds the decrypted values: pass it on, never log it."""

    request: object
    builder: Builder
    pool: ConnectionPool
    env: dict[str, str]
    deadline: Deadline
    log: BuildLog
    workdir: Path


Executor = Callable[[BuildContext], Outcome]

#: kind -> executor.
EXECUTORS: dict[str, Executor] = {}


def executor(kind: str) -> Callable[[Executor], Executor]:
    """Register the decorated function as the executor of build kind ``kind``."""

    def register(fn: Executor) -> Executor:
        EXECUTORS[kind] = fn
        return fn

    return register


def build_source(ctx: BuildContext, source: Source) -> tuple[str, str | None]:
    """Fetch, build and package ``source``: (artifact sha256, git commit or None)."""
    tree = ctx.workdir / "src"
    commit = ctx.builder.fetch(source, tree, ctx.deadline, ctx.log)
    ctx.builder.run_build_script(tree, ctx.env, ctx.deadline, ctx.log)
    artifact = ctx.builder.package(tree, ctx.deadline, ctx.log)
    return artifact.sha256, commit


@executor("upload")
def upload(ctx: BuildContext) -> Outcome:
    request: Upload = ctx.request
    source = UploadSource(request.upload_id) if request.upload_id else ArchiveSource(request.archive_path)
    artifact, _ = build_source(ctx, source)
    return Outcome(artifact, request.version, env_names=tuple(sorted(ctx.env)))


@executor("update")
def update(ctx: BuildContext) -> Outcome:
    request: Update = ctx.request
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
def rollback(ctx: BuildContext) -> Outcome:
    request: Rollback = ctx.request
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
def standalone_build(ctx: BuildContext) -> Outcome:
    request: StandaloneBuild = ctx.request
    source: Source = GitSource(request.git_url, request.ref) if request.git_url else DirectorySource(request.source_dir)
    artifact, commit = build_source(ctx, source)
    version = request.version_tag or (f"git-{commit[:12]}" if commit else None)
    return Outcome(artifact, version, env_names=tuple(sorted(ctx.env)))


@executor("github_clone")
def github_clone(ctx: BuildContext) -> Outcome:
    request: GithubClone = ctx.request
    artifact, commit = build_source(ctx, GitSource(request.repo_url, request.branch))
    return Outcome(
        artifact,
        request.version_override or f"git-{commit[:12]}",
        env_names=tuple(sorted(ctx.env)),
        repo_url=request.repo_url,
        repo_branch=request.branch,
    )


@executor("mcp_upload")
def mcp_upload(ctx: BuildContext) -> Outcome:
    request: McpUpload = ctx.request
    src = request.source
    git = isinstance(src, McpGit)
    if isinstance(src, McpUploaded):
        source: Source = UploadSource(src.upload_id)
    else:
        source = GitSource(src.url, src.ref) if git else ArchiveSource(src.path)
    artifact, commit = build_source(ctx, source)
    version = request.version or (f"git-{commit[:12]}" if commit else None)
    return Outcome(
        artifact,
        version,
        env_names=tuple(sorted(ctx.env)),
        repo_url=src.url if git else None,
        repo_branch=src.ref if git else None,
    )
