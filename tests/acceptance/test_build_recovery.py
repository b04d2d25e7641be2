"""A build whose worker is SIGKILLed mid-build is taken over by another worker and ends in one outcome."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

from conveyor.app import App
from conveyor.settings import Settings
from tests.support.brokers import SERVER_BROKERS
from tests.support.build_sources import (  # noqa: F401
    GATED,
    KEY,
    StoreReads,
    build,
    gate_started,
    make_tree,
    make_zip,
    open_gate,
    sandboxed,
    workdir,
)
from tests.support.waiting import wait_for


@pytest.mark.slow
@pytest.mark.parametrize("broker", SERVER_BROKERS)
def test_a_build_whose_worker_is_sigkilled_is_recovered_and_ends_in_exactly_one_outcome(
    database_url, request, clean_env, workdir, broker
):  # noqa: F811
    if broker == "redis":
        clean_env.setenv("REDIS_URL", request.getfixturevalue("redis_url"))
    for name, value in {
        "DATABASE_URL": database_url,
        "CONVEYOR_BROKER": broker,
        "CONVEYOR_DATA_DIR": str(workdir / "data"),
        "CONVEYOR_SECRET_KEY": KEY,
        "CONVEYOR_BUILD_SOURCE_ROOTS": str(workdir),
        # Short heartbeats, so the dead worker's message and build are recovered within seconds.
        "CONVEYOR_HEARTBEAT_TIMEOUT": "1.5",
        "CONVEYOR_MAINTENANCE_INTERVAL": "0.3",
        "CONVEYOR_PG_LEASE_SECONDS": "1.5",
        "CONVEYOR_PG_RECOVERY_SECONDS": "0.3",
        "CONVEYOR_PG_POLL_SECONDS": "0.2",
        "CONVEYOR_BUILD_HEARTBEAT_INTERVAL": "0.2",
        "CONVEYOR_BUILD_STALE_AFTER": "1",
        "CONVEYOR_SHUTDOWN_TIMEOUT": "5",
    }.items():
        clean_env.setenv(name, value)
    app = App(Settings())
    store = StoreReads(app)
    script = GATED + "echo built\n"
    archive = make_zip(make_tree(workdir / "src", {"agent.py": "run()\n"}, script), workdir / "src.zip")
    ticket = build(
        app,
        "upload",
        {"owner_id": "u1", "agent_id": "agent-k", "archive_path": str(archive)},
        env={"TOKEN": "t0k3n-value", "MARK": "recovery"},
    )
    log = open(workdir / "worker.log", "wb")
    supervisor = subprocess.Popen(
        [sys.executable, "-m", "conveyor", "worker", "--queues", "build", "--threads", "2"],
        stdout=log,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
    )
    try:
        first = wait_for(
            lambda: (r := store.get(ticket.build_id)) and r.status == "building" and r,
            timeout=60,
            message="the first worker to start building",
        )
        assert first.claim == 1
        wait_for(
            lambda: gate_started("recovery"),
            timeout=30,
            message="the build script to start",
        )
        worker_pid = int(first.worker.rsplit(":", 1)[1])
        assert worker_pid != supervisor.pid
        os.kill(worker_pid, signal.SIGKILL)

        # The supervisor starts a new worker; the broker hands it the dead worker's message; it takes the build over.
        second = wait_for(
            lambda: (r := store.get(ticket.build_id)) and r.claim == 2 and r.status == "building" and r,
            timeout=60,
            message="another worker to take the build over",
        )
        assert second.worker != first.worker
        # The dead worker's sandbox died with it (bwrap --die-with-parent); the new claim runs its own.
        wait_for(
            lambda: gate_started("recovery"),
            timeout=30,
            message="the second build script",
        )
        assert len(sandboxed("recovery")) > 0
        open_gate("recovery")
        done = wait_for(
            lambda: (r := store.get(ticket.build_id)) and r.status in ("succeeded", "failed") and r,
            timeout=60,
            message="the build's outcome",
        )
        wait_for(
            lambda: app.broker.get_job(ticket.job_id).state == "completed", timeout=30, message="the job to complete"
        )
    finally:
        supervisor.send_signal(signal.SIGTERM)
        try:
            supervisor.wait(timeout=30)
        except subprocess.TimeoutExpired:
            supervisor.kill()
            supervisor.wait()
        log.close()
    try:
        _assert_one_outcome(app, store, ticket, done)
    finally:
        app.close()
    assert supervisor.returncode == 0
    assert sandboxed("recovery") == []
    assert b"t0k3n-value" not in (workdir / "worker.log").read_bytes()


def _assert_one_outcome(app, store, ticket, done) -> None:
    assert done.status == "succeeded" and done.version == "v1" and done.claim == 2
    assert [e for _, e, _ in store.events(ticket.build_id)] == ["claimed", "taken_over", "succeeded"]
    assert store.versions("agent", "agent-k") == [("v1", done.artifact_sha256)]
    assert store.deployment("agent", "agent-k").build_id == ticket.build_id
    assert store.target("agent", "agent-k").status == "active"
    job = app.broker.get_job(ticket.job_id)
    assert job.attempts == 2
