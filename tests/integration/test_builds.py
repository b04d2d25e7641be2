"""agent.build end to end: every variant (on each broker), rollback, terminal failure, heartbeats, duplicates."""

from __future__ import annotations

import hashlib
import json
import logging
import tarfile
from pathlib import Path

import pytest

from conveyor.app import App
from conveyor.settings import QueueOverride
from tests.support.brokers import ALL_BROKERS
from tests.support.build_sources import (  # noqa: F401 (fixtures)
    GATED,
    StoreReads,
    build,
    build_app,
    commit_change,
    finished,
    gate_started,
    make_repo,
    make_tgz,
    make_tree,
    make_zip,
    open_gate,
    sandboxed,
    workdir,
    workers,
)
from tests.support.waiting import wait_for


def members(app: App, sha256: str) -> dict[str, bytes]:
    path = app.settings.data_dir / "artifacts" / "sha256" / f"{sha256}.tar.gz"
    assert hashlib.sha256(path.read_bytes()).hexdigest() == sha256
    with tarfile.open(path) as tf:
        return {m.name: tf.extractfile(m).read() for m in tf.getmembers() if m.isfile()}


@pytest.mark.parametrize("broker", ALL_BROKERS)
def test_every_build_variant_runs_and_records_its_outcome(build_app, workers, workdir, broker):
    app = build_app(broker=broker, redis_url=None) if broker != "redis" else build_app()
    store = StoreReads(app)
    workers(app)
    script = "echo building; mkdir -p dist && cp agent.py dist/agent.py\n"
    repo = make_tree(workdir / "repo", {"agent.py": "print('v1')\n"}, script)
    first_commit = make_repo(repo)
    plain = make_tree(workdir / "plain", {"server.py": "serve()\n", "lib/util.py": "x = 1\n"})

    clone = build(app, "github_clone", {"owner_id": "u1", "agent_id": "agent-1", "repo_url": str(repo)})
    upload = build(
        app,
        "upload",
        {"owner_id": "u1", "agent_id": "agent-2", "archive_path": str(make_zip(plain, workdir / "plain.zip"))},
    )
    mcp = build(
        app,
        "mcp_upload",
        {
            "owner_id": "u1",
            "connector_id": "conn-1",
            "source": {"type": "archive", "path": str(make_tgz(plain, workdir / "p.tgz"))},
        },
    )
    clone_rec, upload_rec, mcp_rec = finished(store, clone.build_id, upload.build_id, mcp.build_id)
    assert [r.status for r in (clone_rec, upload_rec, mcp_rec)] == ["succeeded"] * 3
    assert clone_rec.version == f"git-{first_commit[:12]}"
    assert members(app, clone_rec.artifact_sha256) == {
        "agent.py": b"print('v1')\n",
        "dist/agent.py": b"print('v1')\n",
        ".conveyor-build": script.encode(),
    }  # built by the script, no .git
    assert upload_rec.version == mcp_rec.version == "v1"
    # Content-addressed: the same tree, from a zip or a tarball, is one artifact.
    assert upload_rec.artifact_sha256 == mcp_rec.artifact_sha256
    agent = store.target("agent", "agent-1")
    assert (agent.status, agent.repo_url) == ("active", str(repo))
    assert store.target("connector", "conn-1").status == "active"

    second_commit = commit_change(repo, "agent.py", "print('v2')\n")
    reclone = build(app, "update", {"owner_id": "u1", "agent_id": "agent-1", "changelog": "v2 logic"})
    from_dir = build(
        app, "update", {"owner_id": "u1", "agent_id": "agent-2", "source_dir": str(plain), "new_version": "2.0"}
    )
    standalone = build(
        app, "standalone_build", {"owner_id": "u1", "agent_id": "agent-1", "git_url": f"file://{repo}", "ref": "main"}
    )
    reclone_rec, dir_rec, standalone_rec = finished(store, reclone.build_id, from_dir.build_id, standalone.build_id)
    assert [r.status for r in (reclone_rec, dir_rec, standalone_rec)] == ["succeeded"] * 3
    assert members(app, reclone_rec.artifact_sha256)["dist/agent.py"] == b"print('v2')\n"
    assert dir_rec.version == "2.0" and dir_rec.artifact_sha256 == upload_rec.artifact_sha256
    assert standalone_rec.version == f"git-{second_commit[:12]}"
    assert "changelog: v2 logic" in reclone_rec.log
    # A standalone build makes a version without deploying it.
    assert store.deployment("agent", "agent-1").version == reclone_rec.version == "v1"
    assert sorted(v for v, _ in store.versions("agent", "agent-1")) == sorted(
        [clone_rec.version, "v1", standalone_rec.version]
    )

    back = build(
        app,
        "rollback",
        {"owner_id": "u1", "agent_id": "agent-1", "target_version": clone_rec.version, "reason": "v2 misbehaves"},
    )
    (back_rec,) = finished(store, back.build_id)
    assert back_rec.status == "succeeded"
    deployed = store.deployment("agent", "agent-1")
    assert (deployed.version, deployed.previous_version, deployed.artifact_sha256) == (
        clone_rec.version,
        "v1",
        clone_rec.artifact_sha256,
    )
    assert "rolling back from v1 to" in back_rec.log
    for record in (clone_rec, upload_rec, mcp_rec, reclone_rec, dir_rec, standalone_rec, back_rec):
        assert [e for _, e, _ in store.events(record.id)] == ["claimed", "succeeded"]


def test_rollback_to_a_version_that_never_existed_fails_the_agent_and_keeps_the_deployment(build_app, workers, workdir):
    app = build_app()
    store = StoreReads(app)
    workers(app)
    one = make_tree(workdir / "one", {"a.py": "1\n"})
    two = make_tree(workdir / "two", {"a.py": "2\n"})
    v1 = build(
        app, "upload", {"owner_id": "u", "agent_id": "ag", "archive_path": str(make_zip(one, workdir / "1.zip"))}
    )
    finished(store, v1.build_id)
    v2 = build(app, "update", {"owner_id": "u", "agent_id": "ag", "source_dir": str(two)})
    finished(store, v2.build_id)
    assert store.deployment("agent", "ag").version == "v2"
    bad = build(app, "rollback", {"owner_id": "u", "agent_id": "ag", "target_version": "v9"})
    (record,) = finished(store, bad.build_id)
    assert record.status == "failed" and "has no version v9 (versions: v1, v2)" in record.error
    agent = store.target("agent", "ag")
    assert agent.status == "failed" and "no version v9" in agent.status_reason
    assert store.deployment("agent", "ag").version == "v2"
    good = build(app, "rollback", {"owner_id": "u", "agent_id": "ag", "target_version": "v1"})
    (record,) = finished(store, good.build_id)
    assert record.status == "succeeded" and store.target("agent", "ag").status == "active"
    assert store.deployment("agent", "ag").version == "v1"
    assert store.deployment("agent", "ag").artifact_sha256 == store.version("agent", "ag", "v1")[1]


def test_a_build_that_fails_for_good_drives_its_target_to_a_terminal_state_once(build_app, workers, workdir, caplog):
    app = build_app(
        build_time_limits={"upload": 1, "mcp_upload": 60},
        queues={"build": QueueOverride(min_backoff=0.05, max_backoff=0.1, max_attempts=2)},
    )
    store = StoreReads(app)
    workers(app)
    broken = make_tree(workdir / "broken", {"a.py": "x\n"}, "echo compiling; echo 'syntax error' >&2; exit 3\n")

    def waits(name: str) -> Path:
        """A tree whose script waits until the test opens the gate in its workspace."""
        return make_tree(workdir / name, {"a.py": "x\n"}, GATED)

    with caplog.at_level(logging.INFO, logger="conveyor.events"):
        fails = build(
            app,
            "upload",
            {"owner_id": "u", "agent_id": "ag-broken", "archive_path": str(make_zip(broken, workdir / "b.zip"))},
        )
        slow_upload = build(
            app,
            "upload",
            {"owner_id": "u", "agent_id": "ag-slow", "archive_path": str(make_zip(waits("upload"), workdir / "w.zip"))},
            env={"MARK": "slow-upload"},
        )
        slow_mcp = build(
            app,
            "mcp_upload",
            {
                "owner_id": "u",
                "connector_id": "conn-slow",
                "source": {"type": "archive", "path": str(make_tgz(waits("mcp"), workdir / "w.tgz"))},
            },
            env={"MARK": "slow-mcp"},
        )
        failed, timed_out = finished(store, fails.build_id, slow_upload.build_id)
        wait_for(
            lambda: gate_started("slow-mcp"),
            timeout=30,
            message="the mcp build script to start",
        )
        open_gate("slow-mcp")
        (mcp,) = finished(store, slow_mcp.build_id)
        wait_for(lambda: len(_events(caplog, "build_failed")) == 2, timeout=10, message="final-failure hooks ran")

    # A failing build script is permanent: one attempt, then the agent is failed.
    assert failed.status == "failed" and "exited with status 3" in failed.error and "syntax error" in failed.log
    assert [e for _, e, _ in store.events(fails.build_id)] == ["claimed", "released", "failed"]
    agent = store.target("agent", "ag-broken")
    assert agent.status == "failed" and "exited with status 3" in agent.status_reason

    # Past its kind's own limit (upload: 1 s here) a build is retried, then fails for good, its sandbox killed.
    assert timed_out.status == "failed" and "upload build exceeded its time limit of 1s" in timed_out.error
    assert [e for _, e, _ in store.events(slow_upload.build_id)] == [
        "claimed",
        "released",
        "claimed",
        "released",
        "failed",
    ]
    assert store.target("agent", "ag-slow").status == "failed"
    assert sandboxed("slow-upload") == []
    # The same script under mcp_upload's limit ran until the gate opened, and succeeded.
    assert mcp.status == "succeeded" and store.target("connector", "conn-slow").status == "active"
    assert sorted(e["build_id"] for e in _events(caplog, "build_failed")) == sorted(
        [fails.build_id, slow_upload.build_id]
    )


def _events(caplog, name: str) -> list[dict]:
    lines = [json.loads(r.getMessage()) for r in caplog.records if r.name == "conveyor.events"]
    return [e for e in lines if e["event"] == name]


def test_a_running_build_heartbeats_and_a_duplicate_delivery_neither_builds_twice_nor_restarts_it(
    build_app, workers, workdir, caplog
):
    app = build_app()
    store = StoreReads(app)
    caplog.set_level(logging.INFO, logger="conveyor.events")
    workers(app)
    tree = make_tree(workdir / "src", {"a.py": "x\n"}, "echo started; " + GATED)
    fields = {"owner_id": "u", "agent_id": "ag-hb", "archive_path": str(make_zip(tree, workdir / "s.zip"))}
    ticket = build(app, "upload", fields, env={"MARK": "heartbeat"})
    wait_for(lambda: gate_started("heartbeat"), timeout=30, message="the build script to start")
    beat = store.get(ticket.build_id).heartbeat_at
    running = wait_for(
        lambda: (r := store.get(ticket.build_id)).heartbeat_at > beat and r, timeout=10, message="a later heartbeat"
    )
    assert running.status == "building" and "started" in running.log  # the log so far is saved with each beat

    # The same build delivered again while the first worker is alive and beating (no key: a broker's redelivery),
    # and the same build requested again: neither starts a second build.
    duplicate = app.jobs.enqueue("agent.build", app.broker.get_job(ticket.job_id).payload)
    assert build(app, "upload", fields, build_id=ticket.build_id, env={"MARK": "heartbeat"}) == type(ticket)(
        ticket.build_id, ticket.job_id, True
    )
    wait_for(lambda: _events(caplog, "retry"), timeout=10, message="the duplicate to defer itself")
    assert store.get(ticket.build_id).claim == 1
    open_gate("heartbeat")
    (done,) = finished(store, ticket.build_id)
    # The duplicate comes back once the heartbeat would be stale, reads the outcome, and ends.
    wait_for(
        lambda: app.broker.get_job(duplicate.id).state == "completed",
        timeout=30,
        message="the duplicate to finish from the outcome",
    )
    assert done.status == "succeeded" and done.claim == 1
    assert [e for _, e, _ in store.events(ticket.build_id)] == ["claimed", "succeeded"]
    assert any(e["reason"] == "build already succeeded" for e in _events(caplog, "skipped"))


def test_a_request_whose_process_died_before_its_enqueue_is_enqueued_when_it_is_sent_again(build_app, workdir):
    from conveyor.platform.builds import store
    from conveyor.platform.builds.payloads import BuildPayload
    from conveyor.platform.builds.requests import request_build

    app = build_app()
    fields = {"agent_id": "ag-orphan", "owner_id": "u1", "upload_id": "upl_" + "a" * 32}
    payload = BuildPayload.load({**fields, "kind": "upload", "build_id": "b-orphan", "env": {}})
    with app.pool.connection() as conn:
        assert store.create_build(conn, payload.root)  # the row, and then the process died
    ticket = request_build(app, "upload", fields, build_id="b-orphan")
    assert ticket.job_id, "the second request enqueued the job the first never did"
    again = request_build(app, "upload", fields, build_id="b-orphan")
    assert (again.job_id, again.deduplicated) == (ticket.job_id, True)
