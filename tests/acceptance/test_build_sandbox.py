"""The build sandbox holds: a hostile .conveyor-build sees no secret, writes nowhere but its workspace, has no
network and is killed at its limits; and no secret value reaches any store or log, however a script got it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tarfile
import time
import uuid
from pathlib import Path

import pytest

from conveyor.app import App
from conveyor.settings import QueueOverride, Settings
from tests.support.build_sources import (  # noqa: F401 (fixtures)
    KEY,
    StoreReads,
    build,
    build_app,
    finished,
    make_tree,
    make_zip,
    sandboxed,
    workdir,
    workers,
)
from tests.support.waiting import wait_for

ADMIN_TOKEN = "adm-7Qx2-sandbox-test-token-91"
#: Who a build script runs as: a uid of its own from CONVEYOR_BUILD_SANDBOX_UIDS under a root worker, else the
#: worker's own (unprivileged) user.
SANDBOX_UIDS = range(2_100_000_000, 2_100_065_536) if os.geteuid() == 0 else range(os.geteuid(), os.geteuid() + 1)
OPENAI_KEY = "sk-proj-sandboxtest-4c1d8e"


def artifact_files(app: App, sha256: str) -> dict[str, str]:
    path = Path(app.settings.data_dir) / "artifacts" / "sha256" / f"{sha256}.tar.gz"
    with tarfile.open(path) as tf:
        return {m.name: tf.extractfile(m).read().decode(errors="replace") for m in tf.getmembers() if m.isfile()}


def probe_script(host_targets: list[Path], redis_port: int) -> str:
    """A script that tries everything a hostile build would, and writes down what it got into its tree."""
    writes = " ".join(str(t) for t in host_targets)
    return f"""set +e
id -u > uid.txt
cat /proc/*/environ 2>/dev/null | tr '\\0' '\\n' > environ.txt
cat /proc/1/environ > pid1.txt 2>/dev/null
ls /proc | grep -c '^[0-9]' > processes.txt
head -c 64 /etc/shadow > shadow.txt 2>/dev/null
for target in {writes}; do
    if (echo escaped > "$target") 2>/dev/null; then echo "$target" >> wrote.txt; fi
done
python3 -c 'import socket; socket.create_connection(("127.0.0.1", {redis_port}), 2)' 2>/dev/null && echo local > net.txt
python3 -c 'import socket; socket.create_connection(("1.1.1.1", 53), 2)' 2>/dev/null && echo internet >> net.txt
python3 -c 'while True: pass'; echo $? > cpu.txt
python3 -c 'b = bytearray(1024 ** 3); print(len(b))' 2>/dev/null; echo $? > memory.txt
head -c 3000000 /dev/zero > big.bin 2>/dev/null; echo $? > fsize.txt
rm -f big.bin
echo done > done.txt
"""


@pytest.mark.slow
def test_a_hostile_build_script_gets_nothing_writes_nothing_outside_and_leaks_no_secret_to_any_store_or_log(
    database_url, redis_url, request, clean_env, workdir
):  # noqa: F811
    """A worker subprocess holding every kind of secret runs two hostile builds.

    The probe reads every /proc/*/environ, /etc/shadow, writes outside its workspace, opens sockets and runs
    into each limit, and packages what it got. The leak prints every environ it can reach and a file holding
    the secrets (as if it learnt them another way), then fails: its error travels to every store.
    """
    data = workdir / "data"
    env = {
        "REDIS_URL": redis_url,
        "DATABASE_URL": database_url,
        "CONVEYOR_BROKER": "redis",
        "CONVEYOR_DATA_DIR": str(data),
        "CONVEYOR_SECRET_KEY": KEY,
        "CONVEYOR_ADMIN_TOKEN": ADMIN_TOKEN,
        "CONVEYOR_OPENAI_API_KEY": OPENAI_KEY,
        "CONVEYOR_BUILD_SOURCE_ROOTS": str(workdir),
        "CONVEYOR_BUILD_CPU_SECONDS": "2",
        "CONVEYOR_BUILD_MEMORY_BYTES": str(512 * 1024**2),
        "CONVEYOR_BUILD_MAX_FILE_BYTES": str(1024**2),
        "CONVEYOR_QUEUES__BUILD__MIN_BACKOFF": "0.05",
        "CONVEYOR_QUEUES__BUILD__MAX_BACKOFF": "0.1",
        "CONVEYOR_SHUTDOWN_TIMEOUT": "5",
        "CONVEYOR_BUILD_HEARTBEAT_INTERVAL": "0.2",
    }
    for name, value in env.items():
        clean_env.setenv(name, value)
    # The failure webhook's URL is left out here: httpx logs it at INFO, which the API-side branch (issue 11
    # item 6) silences and scrubs; tests/test_alert_safety.py holds that.
    secrets = [ADMIN_TOKEN, KEY, OPENAI_KEY]
    app = App(Settings())
    store = StoreReads(app)
    data.mkdir(parents=True, exist_ok=True)
    (data / "canary").write_text("still here\n")
    tag = uuid.uuid4().hex
    outside = [
        data / "escape",
        workdir / "escape",
        Path(f"/tmp/conveyor-escape-{tag}"),
        Path(f"/var/tmp/conveyor-escape-{tag}"),
        Path(f"/etc/conveyor-escape-{tag}"),
        Path(f"/usr/conveyor-escape-{tag}"),
    ]
    redis_port = int(redis_url.rsplit(":", 1)[1].split("/")[0])
    probe = make_zip(
        make_tree(workdir / "probe", {"agent.py": "run()\n"}, probe_script(outside, redis_port)), workdir / "probe.zip"
    )
    leak = make_zip(
        make_tree(
            workdir / "leak",
            {"known.txt": "\n".join(secrets) + "\n"},
            "cat /proc/*/environ | tr '\\0' '\\n'; cat known.txt; "
            'echo "token: $(cat known.txt | head -1)" >&2; exit 3\n',
        ),
        workdir / "leak.zip",
    )
    log_path = workdir / "worker.log"
    log = open(log_path, "wb")
    worker = subprocess.Popen(
        [sys.executable, "-m", "conveyor", "worker", "--queues", "build", "--threads", "2"],
        stdout=log,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
    )
    try:
        probed = build(
            app,
            "upload",
            {"owner_id": "u1", "agent_id": "agent-probe", "archive_path": str(probe)},
            env={"BUILD_FLAG": "own-value"},
        )
        leaked = build(app, "upload", {"owner_id": "u1", "agent_id": "agent-leak", "archive_path": str(leak)})
        probe_rec, leak_rec = finished(store, probed.build_id, leaked.build_id, timeout=120)
        wait_for(
            lambda: app.broker.get_job(leaked.job_id).state == "failed",
            timeout=30,
            message="the leaky job's record to say failed",
        )
    finally:
        worker.send_signal(signal.SIGTERM)
        try:
            worker.wait(timeout=30)
        except subprocess.TimeoutExpired:
            worker.kill()
            worker.wait()
        log.close()

    try:
        assert probe_rec.status == "succeeded", probe_rec.error
        got = artifact_files(app, probe_rec.artifact_sha256)
        assert got["done.txt"] == "done\n"
        # Its own unprivileged user, seeing its own processes only (bwrap's two, sh, cat, tr, ls), and only its own env.
        assert int(got["uid.txt"]) in SANDBOX_UIDS
        assert int(got["processes.txt"]) <= 8
        assert "BUILD_FLAG=own-value" in got["environ.txt"]
        seen = got["environ.txt"] + got["pid1.txt"]
        for value in (*secrets, "CONVEYOR_", "DATABASE_URL", "REDIS_URL"):
            assert value not in seen
        assert got["shadow.txt"] == ""
        # Nothing written outside the workspace; no network; each limit hit.
        # (/tmp is the sandbox's own: a write there succeeds and stays there)
        assert got.get("wrote.txt", "").split() in ([], [str(outside[2])]) and "net.txt" not in got
        escaped = [t for t in outside if t.exists()]
        for path in escaped:
            path.unlink()  # (only if the sandbox failed: leave the host as it was)
        assert escaped == [] and (data / "canary").read_text() == "still here\n"
        assert int(got["cpu.txt"]) in (128 + signal.SIGXCPU, 128 + signal.SIGKILL)  # killed at 2 CPU seconds
        assert int(got["memory.txt"]) != 0  # no 1 GiB under a 512 MiB address space
        assert int(got["fsize.txt"]) == 128 + signal.SIGXFSZ  # no file past 1 MiB

        assert leak_rec.status == "failed" and "exited with status 3" in leak_rec.error
        assert "token: [redacted]" in leak_rec.error and "[redacted]" in leak_rec.log
        with app.pool.connection() as conn:
            tables = [
                row[0]
                for row in conn.execute(
                    "SELECT row_to_json(t)::text FROM (SELECT * FROM builds) t UNION ALL "
                    "SELECT row_to_json(t)::text FROM (SELECT * FROM build_events) t UNION ALL "
                    "SELECT row_to_json(t)::text FROM (SELECT * FROM agents) t"
                )
            ]
        job = app.broker.get_job(leaked.job_id)
        assert "[redacted]" in job.error
        worker_log = log_path.read_text(errors="replace")
        assert '"build_failed"' in worker_log
        everything = "\n".join([*tables, job.error or "", worker_log, leak_rec.log, probe_rec.log])
        for value in secrets:
            assert value not in everything, f"a secret ({len(value)} characters) was stored or logged"
    finally:
        app.close()


@pytest.mark.slow
def test_a_fork_bomb_stays_under_the_process_limit_and_the_whole_sandbox_is_killed_at_the_time_limit(
    build_app, workers, workdir, caplog
):  # noqa: F811
    # Counted in the build's own pids cgroup (and, as its own user, under RLIMIT_NPROC in rlimits-only mode).
    limit = 40
    app = build_app(
        build_max_processes=limit,
        build_time_limits={"upload": 4},
        queues={"build": QueueOverride(min_backoff=0.05, max_backoff=0.1, max_attempts=1)},
    )
    store = StoreReads(app)
    workers(app)
    marker = uuid.uuid4().hex
    bomb = make_tree(workdir / "bomb", {"a.py": "x\n"}, "bomb() { bomb | bomb & }; bomb 2>/dev/null; sleep 600\n")
    ticket = build(
        app,
        "upload",
        {"owner_id": "u", "agent_id": "ag-bomb", "archive_path": str(make_zip(bomb, workdir / "bomb.zip"))},
        env={"MARK": marker},
    )
    peak = 0
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        record = store.get(ticket.build_id)
        if record.status in ("succeeded", "failed"):
            break
        peak = max(peak, len(sandboxed(marker)))
        time.sleep(0.1)
    (record,) = finished(store, ticket.build_id)
    assert record.status == "failed" and "exceeded its time limit of 4s" in record.error
    assert 0 < peak <= limit
    # Every process of the sandbox died with it.
    wait_for(lambda: sandboxed(marker) == [], timeout=10, message="the sandbox's processes to be gone")
    assert [e for _, e, _ in store.events(ticket.build_id)] == ["claimed", "released", "failed"]


def test_a_secret_a_build_prints_is_scrubbed_from_its_log_error_and_events(build_app, workers, workdir):  # noqa: F811
    """Not only the build's own env: every secret setting's value, however the script learnt it."""
    app = build_app(openai_api_key=OPENAI_KEY, admin_token=ADMIN_TOKEN)
    store = StoreReads(app)
    workers(app)
    tree = make_tree(
        workdir / "knows",
        {"known.txt": f"{ADMIN_TOKEN}\n{OPENAI_KEY}\n{KEY}\n"},
        'cat known.txt; echo "admin is $(head -1 known.txt)" >&2; exit 4\n',
    )
    ticket = build(
        app,
        "upload",
        {"owner_id": "u", "agent_id": "ag-knows", "archive_path": str(make_zip(tree, workdir / "knows.zip"))},
    )
    (record,) = finished(store, ticket.build_id)
    assert record.status == "failed" and "admin is [redacted]" in record.error
    wait_for(lambda: app.broker.get_job(ticket.job_id).state == "failed", timeout=30, message="the job record")
    text = "\n".join(
        [
            record.log,
            record.error,
            json.dumps(store.events(ticket.build_id)),
            store.target("agent", "ag-knows").status_reason,
            app.broker.get_job(ticket.job_id).error or "",
        ]
    )
    for value in (ADMIN_TOKEN, OPENAI_KEY, KEY):
        assert value not in text


@pytest.mark.slow
def test_output_without_newlines_does_not_make_the_worker_hold_it(build_app, workers, workdir):  # noqa: F811
    import resource

    app = build_app()
    store = StoreReads(app)
    workers(app)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB, the peak so far
    tree = make_tree(workdir / "loud", {"a.py": "x\n"}, "head -c 200000000 /dev/zero | tr '\\0' x; echo; echo end\n")
    (record,) = finished(
        store,
        build(
            app,
            "upload",
            {"owner_id": "u", "agent_id": "ag-loud", "archive_path": str(make_zip(tree, workdir / "l.zip"))},
        ).build_id,
        timeout=120,
    )
    assert record.status == "succeeded" and "\nend\n" in record.log
    grown = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
    assert grown < 150 * 1024, f"the worker's peak memory grew by {grown // 1024} MiB"
