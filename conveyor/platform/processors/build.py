"""agent.build: run one build variant and finish the job from the outcome in ``builds``.

It runs on the ``build`` queue, not the agent queue: a build blocks its thread for
minutes, while the agent queue's runs are async jobs sharing a few threads.

The loop is the same for every kind:

1. **Claim** the build row (``queued``, or ``building`` with a heartbeat older
   than ``CONVEYOR_BUILD_STALE_AFTER``: its worker died and the broker
   redelivered the job). A build that already ended is finished from its row;
   one still heartbeating elsewhere is retried later (RetryLater, no attempt spent).
2. **Run** the kind's executor under the kind's own time limit, with the env
   decrypted here and nowhere else, while a thread heartbeats the row (and
   saves the log so far) every ``CONVEYOR_BUILD_HEARTBEAT_INTERVAL`` seconds.
3. **Record** the outcome fenced by the claim, then **read it back** to finish
   the job. A failed attempt puts the row back to ``queued`` for the retry.
4. When the job fails for good (BuildFailed at once, or the attempts are
   spent, including by workers that died), the final-failure hook ends the
   build ``failed`` and drives its agent or connector to ``failed``.

Time limits: the job's Dramatiq limit is ``HARD_TIME_LIMIT`` (the longest
variant's plus a margin); the executor runs against the variant's own
``time_limit`` (shortened by ``CONVEYOR_BUILD_TIME_LIMITS__<KIND>``), which
cuts off subprocesses and is checked between files.
"""

from __future__ import annotations

import os
import socket
import threading
from typing import TYPE_CHECKING, Any

from conveyor.errors import JobError, PermanentError, RetryLater
from conveyor.logs import log_event
from conveyor.platform.blueprint import jobs
from conveyor.platform.builds import store
from conveyor.platform.builds.builder import BuildLog, Deadline
from conveyor.platform.builds.cgroups import detect
from conveyor.platform.builds.executors import EXECUTORS, BuildContext
from conveyor.platform.builds.local import LocalBuilder
from conveyor.platform.builds.payloads import BUILD_KINDS, HARD_TIME_LIMIT, MINUTE, BuildPayload, BuildVariant
from conveyor.platform.builds.uploads import Uploads
from conveyor.platform.errors import BuildFailed, BuildTimeout
from conveyor.platform.queues import BUILD
from conveyor.platform.settings import PlatformSettings, platform_settings
from conveyor.redaction import Scrubber
from conveyor.secrets import decrypt_env
from conveyor.settings import Settings
from conveyor.tasks.context import JobContext

if TYPE_CHECKING:
    from psycopg import Connection
    from psycopg_pool import ConnectionPool

#: The longest a variant's limit may be set to: the job's own limit minus time to record the outcome.
MAX_VARIANT_LIMIT = HARD_TIME_LIMIT - 5 * MINUTE


def worker_id() -> str:
    """host:pid of this process, written on the build row it claims."""
    return f"{socket.gethostname()}:{os.getpid()}"


@jobs.check_settings(of=PlatformSettings)
def known_build_kinds(settings: PlatformSettings) -> None:
    """``CONVEYOR_BUILD_TIME_LIMITS__<KIND>`` names only kinds that exist (a typo would be silently ignored)."""
    unknown = sorted(set(settings.build_time_limits) - set(BUILD_KINDS))
    if unknown:
        raise ValueError(f"CONVEYOR_BUILD_TIME_LIMITS: unknown build kind(s) {unknown}; known: {sorted(BUILD_KINDS)}")


@jobs.check_settings(of=PlatformSettings)
def build_isolation(settings: PlatformSettings) -> None:
    """Say at start how builds will be isolated on this host: never silently weaker than asked."""
    ids: dict[str, Any] = dict(queue=None, job=None, job_id=None, attempt=None)
    if settings.build_isolation == "rlimits-only":
        log_event("build_isolation_weak", level="warning", **ids, mode="rlimits-only")
        return
    hierarchy, why_not = detect()
    if hierarchy is None:
        # Not a settings error (the API and the scheduler run no builds): this host's workers refuse them.
        log_event(
            "build_isolation_unavailable",
            level="error",
            **ids,
            reason=why_not,
            effect="builds are refused; CONVEYOR_BUILD_ISOLATION=rlimits-only runs them with per-process limits only",
        )


@jobs.job("agent.build", queue=BUILD, payload=BuildPayload, time_limit=HARD_TIME_LIMIT)
def run_build(payload: BuildPayload, ctx: JobContext) -> None:
    request = payload.root
    settings = ctx.app.settings
    config = platform_settings(ctx.app)
    pool = ctx.app.pool
    ids: dict[str, Any] = dict(queue=ctx.queue, job=ctx.job, job_id=ctx.job_id, attempt=ctx.attempt)
    with pool.connection() as conn:
        claim = store.claim_build(
            conn, request.build_id, worker=worker_id(), job_id=ctx.job_id, stale_after=config.build_stale_after
        )
        if claim is None:
            _finish_unclaimed(conn, request.build_id, config.build_stale_after, ids)
            return
    env = decrypt_env(settings, request.env, **ids)
    # Every settings secret (the library's and the platform's) and every env value, out of the log, the
    # error, the events and the job record.
    log = BuildLog(Scrubber.for_settings(ctx.app.all_settings, env.values()))
    limit = min(config.build_time_limits.get(request.kind, request.time_limit), MAX_VARIANT_LIMIT)
    log.write(f"{request.kind} build {request.build_id}, claim {claim}, time limit {limit:g}s")
    builder = LocalBuilder(settings, config)
    with (
        _Heartbeat(pool, request.build_id, claim, config.build_heartbeat_interval, log, ids),
        builder.workspace(request.build_id, claim) as workdir,
    ):
        try:
            context = BuildContext(request, builder, pool, env, Deadline(limit, request.kind), log, workdir)
            outcome = EXECUTORS[request.kind](context)
            with pool.connection() as conn:
                version = store.record_success(conn, request, claim, outcome, log.text)
        except Exception as exc:
            # The error text may quote build output: mask it like the log.
            error = log.mask(
                str(exc) if isinstance(exc, (BuildFailed, BuildTimeout)) else f"{type(exc).__name__}: {exc}"
            )[:2000]
            log.write(f"error: {error}")
            with pool.connection() as conn:
                store.release_build(conn, request.build_id, claim, error=error, log=log.text)
            if isinstance(exc, PermanentError):
                raise BuildFailed(error) from None
            raise JobError(error) from None
    if version is None:
        log_event("skipped", **ids, reason="another worker took this build over", build_id=request.build_id)
        return
    # The outcome lives in the table: finish the job from what it says.
    with pool.connection() as conn:
        record = store.get_build(conn, request.build_id)
    if record is None or record.status != "succeeded":
        raise JobError(f"build {request.build_id} is {record.status if record else 'gone'} after recording success")
    log_event(
        "build_succeeded",
        **ids,
        build_id=request.build_id,
        kind=request.kind,
        version=record.version,
        artifact=record.artifact_sha256,
    )
    _drop_upload(settings, request)


def _upload_id(request: BuildVariant) -> str | None:
    source = getattr(request, "source", None)
    return getattr(request, "upload_id", None) or getattr(source, "upload_id", None)


def _drop_upload(settings: Settings, request: BuildVariant) -> None:
    """An upload serves one build: once that build has ended, its archive goes."""
    upload_id = _upload_id(request)
    if upload_id:
        Uploads(settings.data_dir).remove(upload_id)


def _finish_unclaimed(conn: Connection[Any], build_id: str, stale_after: float, ids: dict[str, Any]) -> None:
    record = store.get_build(conn, build_id)
    if record is None:
        log_event("skipped", **ids, reason="build no longer exists (its target was deleted)", build_id=build_id)
    elif record.status == "succeeded":
        log_event("skipped", **ids, reason="build already succeeded", build_id=build_id)
    elif record.status == "failed":
        raise BuildFailed(f"build {build_id} already failed: {record.error}")
    else:
        # Another delivery of this job is building it and heartbeating: come back when it would be stale.
        raise RetryLater(f"build {build_id} is being built by {record.worker}", delay=stale_after)


@jobs.on_final_failure("agent.build")
def build_failed_for_good(payload: BuildPayload | None, error: str, ctx: JobContext) -> None:
    """End the build ``failed`` and drive its agent or connector to ``failed``, so nothing waits on it."""
    ids: dict[str, Any] = dict(queue=ctx.queue, job=ctx.job, job_id=ctx.job_id, attempt=ctx.attempt)
    if payload is None:
        log_event("error", level="error", **ids, error="unreadable agent.build payload: no build to fail")
        return
    request = payload.root
    # The error came from this build's own attempt (already scrubbed) or from the broker; scrub it again here
    # with the env too, so no path to the table, the agent's status reason or the log can carry a secret.
    scrub = Scrubber.for_settings(ctx.app.all_settings, decrypt_env(ctx.app.settings, request.env, **ids).values())
    error = scrub(error) or ""
    _drop_upload(ctx.app.settings, request)
    with ctx.app.pool.connection() as conn:
        failed = store.fail_build(conn, request.build_id, error)
    if failed:
        log_event(
            "build_failed",
            level="error",
            **ids,
            build_id=request.build_id,
            kind=request.kind,
            target=f"{request.target_kind}:{request.target_id}",
        )


class _Heartbeat:
    """A thread that keeps ``builds.heartbeat_at`` fresh (and saves the log) while a build runs."""

    def __init__(
        self, pool: ConnectionPool, build_id: str, claim: int, interval: float, log: BuildLog, ids: dict[str, Any]
    ) -> None:
        self.pool, self.build_id, self.claim, self.interval, self.log, self.ids = (
            pool,
            build_id,
            claim,
            interval,
            log,
            ids,
        )
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"conveyor-build-heartbeat-{build_id}", daemon=True)

    def __enter__(self) -> "_Heartbeat":
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                with self.pool.connection() as conn:
                    alive = store.heartbeat(conn, self.build_id, self.claim, self.log.text)
                if not alive:
                    log_event(
                        "stalled",
                        level="warning",
                        **self.ids,
                        build_id=self.build_id,
                        reason="this worker no longer owns the build (taken over after a missed heartbeat)",
                    )
                    return
            except Exception as exc:  # Postgres away for a moment: the next beat may get through
                log_event(
                    "error",
                    level="warning",
                    **self.ids,
                    build_id=self.build_id,
                    error=f"heartbeat failed: {type(exc).__name__}",
                )
