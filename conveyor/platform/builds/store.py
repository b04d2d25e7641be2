"""Builds, their targets (agents and MCP connectors), versions and deployments in Postgres.

A build row is the outcome: ``queued`` → ``building`` (claimed, heartbeating)
→ ``succeeded`` or ``failed``. Every write by a worker is fenced by the
claim number it got, so a worker presumed dead that wakes up cannot
overwrite the outcome of the worker that took its build over; and a unique
index lets a build record one outcome only.

Plain functions over a connection, returning frozen dataclasses, like
:mod:`conveyor.platform.records`; the SQL is in ``queries.sql``. The
functions that write more than one row open their own transaction.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from conveyor.errors import RecordNotFound
from conveyor.platform.builds.payloads import BuildVariant
from conveyor.platform.errors import BuildFailed
from conveyor.queries import load_queries

if TYPE_CHECKING:
    from psycopg import Connection

QUERIES = load_queries(Path(__file__).with_name("queries.sql"))


@dataclass(frozen=True)
class Target:
    """An agent or a connector, as far as builds are concerned."""

    kind: str
    id: str
    owner_id: str
    status: str
    status_reason: str | None
    repo_url: str | None
    repo_branch: str | None


@dataclass(frozen=True)
class BuildRecord:
    """A build as the API shows it. It holds no env: secrets never leave the payload."""

    id: str
    kind: str
    agent_id: str | None
    connector_id: str | None
    owner_id: str
    status: str
    version: str | None
    artifact_sha256: str | None
    log: str
    error: str | None
    claim: int
    worker: str | None
    job_id: str | None
    heartbeat_at: datetime | None
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Deployment:
    """What a target runs now, and what it ran before (a rollback's way back)."""

    version: str
    artifact_sha256: str
    previous_version: str | None
    build_id: str
    updated_at: datetime

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Outcome:
    """What an executor produced, for :func:`record_success` to record.

    ``version`` None means "the next v<n>"; ``new_version`` is False for a
    rollback, which points at a version that already exists.
    """

    artifact_sha256: str
    version: str | None = None
    new_version: bool = True
    env_names: tuple[str, ...] = ()
    repo_url: str | None = None
    repo_branch: str | None = None


# -- producer side -------------------------------------------------------------


def create_build(conn: Connection[Any], request: BuildVariant) -> bool:
    """The build's row and its target, moved to ``building`` when the build deploys.

    Once per build id: False (and nothing changed) when the build exists already. The target is
    created for the build's owner, or locked if it is theirs, in the same transaction as the
    build's row: :class:`RecordNotFound` (404, as a missing target) when it is another owner's,
    and nothing is written. Two users racing on one new id cannot both pass.
    """
    kind = request.target_kind
    with conn.transaction():
        own = {"id": request.target_id, "owner_id": request.owner_id}
        if conn.execute(QUERIES[f"{kind}_ensure"], own).fetchone() is None:
            raise RecordNotFound(f"no {kind} {request.target_id!r}")
        created = (
            conn.execute(
                QUERIES["build_insert"],
                {
                    "id": request.build_id,
                    "kind": getattr(request, "kind"),  # each variant's own Literal field, not the base's
                    "owner_id": request.owner_id,
                    "agent_id": request.target_id if kind == "agent" else None,
                    "connector_id": request.target_id if kind == "connector" else None,
                },
            ).fetchone()
            is not None
        )
        if created and request.deploys:
            _set_target_status(conn, kind, request.target_id, request.owner_id, "building")
        return created


def set_build_job(conn: Connection[Any], build_id: str, job_id: str) -> None:
    """Note the job that builds it (the first one enqueued)."""
    conn.execute(QUERIES["build_set_job"], {"id": build_id, "job_id": job_id})


# -- worker side ---------------------------------------------------------------


def claim_build(conn: Connection[Any], build_id: str, *, worker: str, job_id: str, stale_after: float) -> int | None:
    """Claim a queued build, or take over one whose worker stopped heartbeating; None when neither applies."""
    with conn.transaction():
        row = conn.execute(QUERIES["build_lock"], {"id": build_id, "stale": stale_after}).fetchone()
        if row is None:
            return None
        status, _, stale = row
        if not (status == "queued" or (status == "building" and stale)):
            return None
        claimed = conn.execute(QUERIES["build_claim"], {"id": build_id, "worker": worker, "job_id": job_id}).fetchone()
        assert claimed is not None  # the row is locked by this transaction
        claim: int = claimed[0]
        event = "claimed" if status == "queued" else "taken_over"
        _event(conn, build_id, claim, event, worker)
        return claim


def heartbeat(conn: Connection[Any], build_id: str, claim: int, log: str) -> bool:
    """Mark the build alive and save its log so far; False when this claim no longer owns it."""
    return conn.execute(QUERIES["build_heartbeat"], {"id": build_id, "claim": claim, "log": log}).rowcount == 1


def release_build(conn: Connection[Any], build_id: str, claim: int, *, error: str, log: str) -> bool:
    """Give the build back to ``queued`` after a failed attempt (it may be retried)."""
    with conn.transaction():
        row = conn.execute(
            QUERIES["build_release"], {"id": build_id, "claim": claim, "error": error, "log": log}
        ).fetchone()
        if row:
            _event(conn, build_id, claim, "released", error)
        return row is not None


def record_success(conn: Connection[Any], request: BuildVariant, claim: int, outcome: Outcome, log: str) -> str | None:
    """Record a successful build in one transaction: its version, the deployment, the target, the outcome.

    Returns the version, or None when this claim lost the build to another worker.
    Raises :class:`BuildFailed` when the version exists with different content.
    """
    kind, target_id = request.target_kind, request.target_id
    try:
        with conn.transaction():
            # Serialises builds of one target, so two cannot take the same next version.
            target = conn.execute(QUERIES[f"{kind}_lock"], {"id": target_id}).fetchone()
            if target is None:
                raise BuildFailed(f"{kind} {target_id} no longer exists")
            if target[1] != request.owner_id:  # a build recorded before the owner was checked with its row
                raise BuildFailed(f"{kind} {target_id} is not the build owner's")
            key = {"kind": kind, "id": target_id}
            version = outcome.version or _next_version(conn, kind, target_id)
            if outcome.new_version:
                conn.execute(
                    QUERIES["version_insert"],
                    {
                        **key,
                        "version": version,
                        "artifact": outcome.artifact_sha256,
                        "build_id": request.build_id,
                        "env_names": list(outcome.env_names),
                    },
                )
                stored = get_version(conn, kind, target_id, version)
                if stored is None or stored[1] != outcome.artifact_sha256:
                    raise BuildFailed(f"{kind} {target_id} already has a version {version} with other content")
            if request.deploys:
                conn.execute(
                    QUERIES["deployment_upsert"],
                    {**key, "version": version, "artifact": outcome.artifact_sha256, "build_id": request.build_id},
                )
                _set_target_status(
                    conn,
                    kind,
                    target_id,
                    request.owner_id,
                    "active",
                    repo_url=outcome.repo_url,
                    repo_branch=outcome.repo_branch,
                )
            done = conn.execute(
                QUERIES["build_succeed"],
                {
                    "id": request.build_id,
                    "claim": claim,
                    "version": version,
                    "artifact": outcome.artifact_sha256,
                    "log": log,
                },
            ).fetchone()
            if done is None:
                raise _LostClaim()
            _event(conn, request.build_id, claim, "succeeded", version)
            return version
    except _LostClaim:
        return None


def fail_build(conn: Connection[Any], build_id: str, error: str) -> bool:
    """End a build ``failed`` and its target ``failed``, once; False when it had already ended."""
    with conn.transaction():
        row = conn.execute(QUERIES["build_fail"], {"id": build_id, "error": error}).fetchone()
        if row is None:
            return False
        claim, _, agent_id, connector_id, owner_id = row
        _event(conn, build_id, claim, "failed", error)
        kind, target_id = ("agent", agent_id) if agent_id else ("connector", connector_id)
        # Only the owner's target: a build recorded against another user's agent never marks it failed.
        reason = f"build {build_id} failed: {error}"[:2000]
        _set_target_status(conn, kind, target_id, owner_id, "failed", reason=reason)
        return True


# -- reading -------------------------------------------------------------------


def get_build(conn: Connection[Any], build_id: str) -> BuildRecord | None:
    row = conn.execute(QUERIES["build_get"], {"id": build_id}).fetchone()
    return BuildRecord(*row) if row else None


def build_events(conn: Connection[Any], build_id: str) -> list[tuple[int, str, str | None]]:
    """The build's history: (claim, event, detail), oldest first."""
    return [(row[0], row[1], row[2]) for row in conn.execute(QUERIES["build_events"], {"id": build_id})]


def get_target(conn: Connection[Any], kind: str, target_id: str) -> Target | None:
    row = conn.execute(QUERIES[f"{kind}_get"], {"id": target_id}).fetchone()
    return Target(kind, *row) if row else None


def get_version(conn: Connection[Any], kind: str, target_id: str, version: str) -> tuple[str, str] | None:
    """(version, artifact sha256) of one version of a target, or None."""
    row = conn.execute(QUERIES["version_get"], {"kind": kind, "id": target_id, "version": version}).fetchone()
    return (row[0], row[1]) if row else None


def list_versions(conn: Connection[Any], kind: str, target_id: str) -> list[tuple[str, str]]:
    """(version, artifact sha256) of every version of a target, oldest first."""
    return [(row[0], row[1]) for row in conn.execute(QUERIES["version_list"], {"kind": kind, "id": target_id})]


def get_deployment(conn: Connection[Any], kind: str, target_id: str) -> Deployment | None:
    """What the target runs now, or None before its first deployment."""
    row = conn.execute(QUERIES["deployment_get"], {"kind": kind, "id": target_id}).fetchone()
    return Deployment(*row) if row else None


# -- helpers -------------------------------------------------------------------


def _set_target_status(
    conn: Connection[Any],
    kind: str,
    target_id: str,
    owner_id: str,
    status: str,
    *,
    reason: str | None = None,
    repo_url: str | None = None,
    repo_branch: str | None = None,
) -> None:
    """A target's status (and reason), when it is ``owner_id``'s; a ``repo_url`` given replaces the one it is
    rebuilt from."""
    conn.execute(
        QUERIES[f"{kind}_set_status"],
        {
            "id": target_id,
            "owner_id": owner_id,
            "status": status,
            "reason": reason,
            "repo_url": repo_url,
            "repo_branch": repo_branch,
        },
    )


def _next_version(conn: Connection[Any], kind: str, target_id: str) -> str:
    """``v<n>``, one past the highest ``v<n>`` the target has."""
    row = conn.execute(QUERIES["version_next"], {"kind": kind, "id": target_id}).fetchone()
    assert row is not None  # an aggregate has one row
    version: str = row[0]
    return version


def _event(conn: Connection[Any], build_id: str, claim: int, event: str, detail: str | None) -> None:
    conn.execute(QUERIES["build_event"], {"id": build_id, "claim": claim, "event": event, "detail": detail})


class _LostClaim(Exception):
    """Another worker took this build over; raised inside record_success() to roll its transaction back."""
