"""A hostile tenant's build cannot reach the host or another tenant's build (issue 17, findings 1, 3, 4).

- its variables never reach a host-side process, and a loader variable is refused (the LD_PRELOAD escape);
- no host path shows inside the sandbox;
- its memory, processes and disk are its own cgroup's and workspace's, whatever its process tree does, and
  another tenant's build runs meanwhile.

Run as root like CI: the cgroups are the worker's (v2, else v1); a worker that cannot make them refuses builds.
"""

from __future__ import annotations

import os
import re
import subprocess
import tarfile
import threading
import time
import uuid
from pathlib import Path

import httpx
import psutil
import pytest

from conveyor.app import App
from conveyor.errors import InvalidPayload
from conveyor.platform.builds.builder import BuildLog, Deadline
from conveyor.platform.builds.cgroups import PREFIX, detect
from conveyor.platform.builds.sandbox import Sandbox
from conveyor.platform.errors import BuildFailed
from conveyor.platform.settings import platform_settings
from conveyor.settings import QueueOverride
from tests.support.build_sources import (  # noqa: F401 (fixtures)
    GATED,
    StoreReads,
    build,
    build_app,
    finished,
    gate_started,
    make_tree,
    make_zip,
    open_gate,
    sandboxed,
    workdir,
    workers,
)
from tests.support.obs_support import api_server
from tests.support.waiting import wait_for

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the build cgroups are made by a root worker (as in CI)")

MiB = 1024**2
SECRET = "tenant-secret-5b1f0c9e"


def artifact_files(app: App, sha256: str) -> dict[str, str]:
    path = Path(app.settings.data_dir) / "artifacts" / "sha256" / f"{sha256}.tar.gz"
    with tarfile.open(path) as tf:
        return {m.name: tf.extractfile(m).read().decode(errors="replace") for m in tf.getmembers() if m.isfile()}


def preload_library(dest: Path, target: Path) -> Path:
    """A shared object whose constructor appends its pid to ``target``: proof that it ran where ``target`` is."""
    source = dest.with_suffix(".c")
    source.write_text(
        "#include <stdio.h>\n#include <unistd.h>\n"
        "__attribute__((constructor)) static void escape(void) {\n"
        f'    FILE *f = fopen("{target}", "a");\n'
        '    if (f) { fprintf(f, "%d\\n", (int)getpid()); fclose(f); }\n'
        "}\n"
    )
    subprocess.run(["cc", "-shared", "-fPIC", "-o", str(dest), str(source)], check=True, capture_output=True)
    return dest


@pytest.fixture
def host_dir():
    """A directory on the host outside /tmp: visible (read-only) inside the sandbox, writable only outside it."""
    path = Path("/var/tmp") / f"conveyor-isolation-{uuid.uuid4().hex}"
    path.mkdir(mode=0o755)
    yield path
    subprocess.run(["rm", "-rf", str(path)], check=False)


def _same_pid_namespace(pid: int) -> bool:
    try:
        return os.readlink(f"/proc/{pid}/ns/pid") == os.readlink("/proc/self/ns/pid")
    except OSError:
        return False


def _holding(value: str) -> tuple[list[int], list[int]]:
    """(host-side pids, sandboxed pids) of the processes whose environ or argv holds ``value``."""
    host, inside = [], []
    for proc in psutil.process_iter():
        try:
            text = "\0".join(f"{k}={v}" for k, v in proc.environ().items()) + "\0" + "\0".join(proc.cmdline())
        except psutil.Error:
            continue
        if value in text:
            (host if _same_pid_namespace(proc.pid) else inside).append(proc.pid)
    return host, inside


def _launcher_environs() -> list[set[str]]:
    """The variable names of each bwrap running on the host side (in this pid namespace)."""
    found = []
    for proc in psutil.process_iter():
        try:
            if _same_pid_namespace(proc.pid) and proc.cmdline()[:1] and Path(proc.cmdline()[0]).name == "bwrap":
                found.append(set(proc.environ()))
        except psutil.Error:
            pass
    return found


def _cpu_quota(path: Path) -> float | None:
    """The cores a cgroup may use (v2 cpu.max, v1 cfs quota over period); None for a directory without them."""
    if (path / "cpu.max").exists():
        quota, period = (path / "cpu.max").read_text().split()
        return int(quota) / int(period)
    if (path / "cpu.cfs_quota_us").exists():
        return int((path / "cpu.cfs_quota_us").read_text()) / int((path / "cpu.cfs_period_us").read_text())
    return None


def _usage(log: str) -> tuple[int, int, int, int]:
    """(peak memory, memory cap, peak processes, process cap) from the build log's sandbox line."""
    found = re.search(r"sandbox: peak memory (\d+) of (\d+) bytes, peak processes (\d+) of (\d+)", log)
    assert found, log[-2000:]
    return tuple(int(n) for n in found.groups())  # type: ignore[return-value]


def _leftover_cgroups() -> list[Path]:
    hierarchy, _ = detect()
    assert hierarchy is not None
    mine = f"{PREFIX}{os.getpid()}-"
    return [p for parent in set(hierarchy.parents.values()) for p in parent.glob(f"{mine}*")]


def test_a_loader_variable_is_refused_at_the_api_naming_it_and_never_echoing_its_value(
    build_app,
    workdir,
    host_dir,  # noqa: F811
):
    """The escape: a .so in the tenant's hands, named by LD_PRELOAD. Today's code ran it in prlimit on the host."""
    escaped = host_dir / "escaped"
    library = preload_library(host_dir / "evil.so", escaped)
    app = build_app()
    tree = make_tree(workdir / "src", {"a.py": "x\n"}, "echo built\n")
    fields = {"owner_id": "u1", "agent_id": "ag-pre", "archive_path": str(make_zip(tree, workdir / "s.zip"))}
    for env in (
        {"LD_PRELOAD": str(library)},
        {"LD_LIBRARY_PATH": str(host_dir), "OK_NAME": "x"},
        {"GCONV_PATH": str(host_dir)},
        {"MALLOC_ARENA_MAX": "2"},
        {"ld_audit": str(library)},
    ):
        with pytest.raises(InvalidPayload) as refused:
            build(app, "upload", fields, env=env)
        text = str(refused.value)
        bad = [name for name in env if name != "OK_NAME"]
        assert all(name in text for name in bad) and "OK_NAME" not in text
        assert str(library) not in text and str(host_dir) not in text
    with app.pool.connection() as conn:
        assert conn.execute("SELECT count(*) FROM builds").fetchone()[0] == 0
    # Over HTTP: a 422 naming the variable, not its value.
    with api_server(app) as url, httpx.Client(base_url=url, timeout=30) as client:
        body = {
            "kind": "rollback",
            "owner_id": "u1",
            "agent_id": "ag-pre",
            "target_version": "v1",
            "env": {"LD_PRELOAD": str(library), "HOSTALIASES": str(host_dir / "hosts")},
        }
        answer = client.post("/api/builds", json=body, headers={"Authorization": "Bearer admin-token-builds-7e2d"})
    assert answer.status_code == 422
    assert "LD_PRELOAD" in answer.text and "HOSTALIASES" in answer.text and str(host_dir) not in answer.text
    assert not escaped.exists()


def test_a_build_variable_reaches_no_host_side_process_even_a_loader_variable_past_validation(
    build_app,
    workers,
    workdir,
    host_dir,  # noqa: F811
):
    """A running build's value is in the environ of sandboxed processes only, in no host-side process's environ or
    argv; and a loader variable that got past the payload's check still runs nothing on the host."""
    app = build_app()
    store = StoreReads(app)
    workers(app)
    script = "cat /proc/self/mountinfo > mountinfo.txt; " + GATED
    tree = make_tree(workdir / "src", {"a.py": "x\n"}, script)
    ticket = build(
        app,
        "upload",
        {"owner_id": "u1", "agent_id": "ag-env", "archive_path": str(make_zip(tree, workdir / "s.zip"))},
        env={"MARK": "env-probe", "TENANT_TOKEN": SECRET},
    )
    wait_for(lambda: gate_started("env-probe"), timeout=60, message="the build script to start")
    host_side, inside = _holding(SECRET)
    launchers = _launcher_environs()
    open_gate("env-probe")
    (record,) = finished(store, ticket.build_id)
    assert record.status == "succeeded", record.error
    assert inside, "the build's own processes hold its variable (else this test proves nothing)"
    assert host_side == [], [psutil.Process(p).cmdline() for p in host_side if psutil.pid_exists(p)]
    # The launchers' environment is the fixed one.
    assert launchers and all(names <= {"PATH", "LANG"} for names in launchers), launchers
    # No host path shows inside: not the workspace's, not the data dir's.
    mountinfo = artifact_files(app, record.artifact_sha256)["mountinfo.txt"]
    assert str(workdir) not in mountinfo and "/builds/" not in mountinfo and " /tmp/build " in mountinfo

    # Past the payload's check (as if a producer skipped it): the sandbox refuses it too, running nothing.
    escaped = host_dir / "escaped"
    library = preload_library(host_dir / "evil.so", escaped)
    sandbox = Sandbox(app.settings, platform_settings(app))
    tree = make_tree(workdir / "direct" / "src", {"a.py": "x\n"}, "echo ran\n")
    with pytest.raises(BuildFailed, match="LD_PRELOAD"):
        sandbox.run(tree, ["sh", ".conveyor-build"], {"LD_PRELOAD": str(library)}, Deadline(60, "t"), BuildLog(), "x")
    # A NUL in a value would split bwrap's NUL-separated options: refused by name at the request and here.
    injected = {"INNOCENT": "x\0--bind\0/\0/tmp/build/host"}
    with pytest.raises(InvalidPayload, match="INNOCENT") as refused:
        build(
            app,
            "upload",
            {"owner_id": "u1", "agent_id": "ag-nul", "archive_path": str(workdir / "s.zip")},
            env=injected,
        )
    assert "--bind" not in str(refused.value)
    with pytest.raises(BuildFailed, match="INNOCENT"):
        sandbox.run(tree, ["sh", ".conveyor-build"], injected, Deadline(60, "t"), BuildLog(), "x")
    # And past that check as well: the variable is set inside the sandbox only, where the library may run
    # (its constructor cannot write to the host); no host-side launcher loads it.
    log = BuildLog()
    code, _ = sandbox._run(tree, ["sh", ".conveyor-build"], {"LD_PRELOAD": str(library)}, Deadline(60, "t"), log, "x")
    assert code == 0 and "ran" in log.text
    assert not escaped.exists(), f"a host-side process ran the tenant's library: pids {escaped.read_text().split()}"


@pytest.mark.slow
def test_a_hostile_build_s_memory_across_four_processes_stays_under_its_cap(build_app, workers, workdir):  # noqa: F811
    """Four processes of 150 MiB each under a 300 MiB build: today each was under its own address-space limit and
    the build held ~640 MiB; now the kernel counts them together and kills past the cap."""
    cap = 300 * MiB
    app = build_app(build_memory_bytes=cap, queues={"build": QueueOverride(max_attempts=1)})
    store = StoreReads(app)
    workers(app)
    hog = "import time; b = b'x' * (150 * 1024 * 1024); time.sleep(4)"
    script = (
        f'for i in 1 2 3 4; do (python3 -c "{hog}" && touch ok-$i) & done; wait\n'
        "ls ok-* 2>/dev/null | wc -l > survivors.txt; rm -f ok-*\n"
    )
    tree = make_tree(workdir / "hog", {"a.py": "x\n"}, script)
    ticket = build(
        app,
        "upload",
        {"owner_id": "u1", "agent_id": "ag-hog", "archive_path": str(make_zip(tree, workdir / "h.zip"))},
        env={"MARK": "hog"},
    )
    peak = _sample(store, ticket.build_id, lambda: sum(_uss(p) for p in sandboxed("hog")))
    (record,) = finished(store, ticket.build_id, timeout=60)
    assert record.status == "succeeded", record.error
    survivors = int(artifact_files(app, record.artifact_sha256)["survivors.txt"])
    print(
        f"\nmemory: 4 x 150 MiB under a {cap // MiB} MiB cap: {peak / MiB:.0f} MiB at most (sum of USS sampled), "
        f"{survivors} of 4 processes finished"
    )
    # The USS sum samples each process at its own instant, so a process read just before the kernel killed it
    # and another read just after growing can add up a little past the cap (seen: 300.4 MiB under 300 in a
    # loaded full run); the cgroup's own peak below is the exact check.
    assert peak <= cap + 4 * MiB and survivors < 4
    used, limit, _, _ = _usage(record.log)
    print(f"memory: the build's cgroup counted a peak of {used / MiB:.0f} MiB")
    assert limit == cap and used <= cap and "killed at the memory limit" in record.log


@pytest.mark.slow
def test_a_fork_bomb_is_capped_per_build_and_another_tenant_s_build_still_runs(build_app, workers, workdir):  # noqa: F811
    """Today every build ran as nobody under one RLIMIT_NPROC: a bomb took every slot and another tenant's
    ordinary build failed with 'Cannot fork'. Now each build counts its own tree (its pids cgroup)."""
    limit = 40
    app = build_app(
        build_max_processes=limit,
        build_time_limits={"upload": 12},
        queues={"build": QueueOverride(min_backoff=0.05, max_backoff=0.1, max_attempts=1)},
    )
    store = StoreReads(app)
    workers(app)
    # Forks until it cannot, then keeps every process it got and tries again: it holds all the slots it can.
    holder = (
        "import os, time\n"
        "while True:\n"
        "    try:\n"
        "        if os.fork() == 0:\n"
        "            time.sleep(600)\n"
        "            os._exit(0)\n"
        "    except OSError:\n"
        "        time.sleep(0.05)\n"
    )
    bomb = make_tree(workdir / "bomb", {"hold.py": holder}, "python3 hold.py\n")
    bombing = build(
        app,
        "upload",
        {"owner_id": "tenant-a", "agent_id": "ag-bomb", "archive_path": str(make_zip(bomb, workdir / "b.zip"))},
        env={"MARK": "bomb"},
    )
    peak = [0]

    def watch() -> None:
        while (r := store.get(bombing.build_id)) is None or r.status not in ("succeeded", "failed"):
            peak[0] = max(peak[0], len(sandboxed("bomb")))
            time.sleep(0.05)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    # (bwrap's own processes take 3 of the build's slots and carry no MARK)
    wait_for(lambda: len(sandboxed("bomb")) >= limit - 6, timeout=30, message="the bomb to take its slots")
    quotas = {_cpu_quota(path) for path in _leftover_cgroups()} - {None}
    assert quotas == {1.0}  # CONVEYOR_BUILD_CPUS: one core
    ordinary = make_tree(
        workdir / "ordinary",
        {"a.py": "x\n"},
        "for i in $(seq 20); do sleep 1 & done; wait && echo ok > ok.txt\n",
    )
    other = build(
        app,
        "upload",
        {"owner_id": "tenant-b", "agent_id": "ag-other", "archive_path": str(make_zip(ordinary, workdir / "o.zip"))},
    )
    (done,) = finished(store, other.build_id, timeout=30)
    assert done.status == "succeeded", done.log[-1000:]  # today: "Cannot fork"
    assert store.get(bombing.build_id).status == "building", "the bomb ran alongside the other build"
    (bombed,) = finished(store, bombing.build_id, timeout=60)
    watcher.join(timeout=10)
    _, _, counted, cap = _usage(bombed.log)
    print(f"\nprocesses: fork bomb under a cap of {limit}: peak {counted} (cgroup), {peak[0]} (sampled)")
    assert artifact_files(app, done.artifact_sha256)["ok.txt"] == "ok\n"
    assert bombed.status == "failed" and "exceeded its time limit of 12s" in bombed.error
    assert cap == limit and counted <= limit and peak[0] <= limit
    # Killed at its time limit, its whole tree and its cgroup are gone.
    wait_for(lambda: sandboxed("bomb") == [], timeout=10, message="the bomb's processes to be gone")
    assert _leftover_cgroups() == []


@pytest.mark.slow
def test_a_build_that_fills_its_workspace_gets_enospc_and_the_host_disk_holds_no_more(
    build_app,
    workers,
    workdir,  # noqa: F811
):
    """Today only each file's size was capped (1 GiB) while the script ran: 100 MB went to the host's disk."""
    cap = 16 * MiB
    files = 300
    app = build_app(build_workspace_bytes=cap, build_max_source_files=files)
    store = StoreReads(app)
    workers(app)
    script = (
        "head -c 100000000 /dev/zero > fill.bin; rc=$?\n"
        "size=$(stat -c %s fill.bin); sleep 1; rm -f fill.bin\n"
        'echo "$rc" > fill-rc.txt; echo "$size" > fill-size.txt\n'
        "n=0; while [ $n -lt 2000 ] && touch inode-$n 2>/dev/null; do n=$((n + 1)); done\n"
        "rm -f inode-*; echo $n > files.txt\n"
    )
    tree = make_tree(workdir / "fill", {"a.py": "x\n"}, script)
    ticket = build(
        app,
        "upload",
        {"owner_id": "u1", "agent_id": "ag-fill", "archive_path": str(make_zip(tree, workdir / "f.zip"))},
    )
    builds = Path(app.settings.data_dir) / "builds"
    peak = _sample(store, ticket.build_id, lambda: _disk_usage(builds))
    (record,) = finished(store, ticket.build_id, timeout=60)
    assert record.status == "succeeded", record.error
    got = artifact_files(app, record.artifact_sha256)
    assert {"fill-rc.txt", "fill-size.txt", "files.txt"} <= set(got), (sorted(got), record.log[-1500:])
    written, made = int(got["fill-size.txt"]), int(got["files.txt"])
    print(
        f"\ndisk: 100 MB written under a {cap // MiB} MiB workspace: {written / MiB:.1f} MiB written, "
        f"exit {got['fill-rc.txt'].strip()}; host disk under builds/ peaked at {peak / 1024:.0f} KiB; "
        f"{made} files made under a cap of {files}"
    )
    assert int(got["fill-rc.txt"]) != 0 and "No space left on device" in record.log
    assert written <= cap
    assert peak <= cap
    assert made <= files + 16


def _sample(store: StoreReads, build_id: str, measure) -> int:
    """The largest value ``measure()`` gave while the build ran."""
    peak = 0
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        record = store.get(build_id)
        if record is not None and record.status in ("succeeded", "failed"):
            break
        peak = max(peak, measure())
        time.sleep(0.05)
    return peak


def _uss(proc: psutil.Process) -> int:
    """The memory only this process holds (the libraries' pages it shares are charged to whoever loaded them)."""
    try:
        return proc.memory_full_info().uss
    except psutil.Error:
        return 0


def _disk_usage(path: Path) -> int:
    total = 0
    for dirpath, _, filenames in os.walk(path):
        for name in filenames:
            try:
                total += os.lstat(os.path.join(dirpath, name)).st_blocks * 512
            except OSError:
                pass
    return total


def test_a_worker_that_cannot_make_a_cgroup_says_so_and_refuses_builds_unless_told_to_use_rlimits_only(
    build_app,
    workdir,
    monkeypatch,
    caplog,  # noqa: F811
):
    """A container without cgroup delegation (simulated: the detection finds nothing) is never silently weaker."""
    import logging

    from conveyor.platform.builds import sandbox as sandbox_module
    from conveyor.platform.errors import SandboxUnavailable
    from conveyor.platform.processors.build import build_isolation

    monkeypatch.setattr(sandbox_module, "detect", lambda: (None, "cgroup v1: the worker's pids cgroup is not writable"))
    monkeypatch.setattr("conveyor.platform.processors.build.detect", sandbox_module.detect)
    app = build_app()
    with caplog.at_level(logging.INFO, logger="conveyor.events"):
        build_isolation(platform_settings(app))
    assert "build_isolation_unavailable" in caplog.text and "not writable" in caplog.text
    tree = make_tree(workdir / "w" / "src", {"a.py": "x\n"}, "echo made > made.txt\n")
    with pytest.raises(SandboxUnavailable, match="CONVEYOR_BUILD_ISOLATION=rlimits-only"):
        Sandbox(app.settings, platform_settings(app)).run(
            tree, ["sh", ".conveyor-build"], {}, Deadline(60, "t"), BuildLog(), "x"
        )
    assert not (tree / "made.txt").exists()
    weaker = platform_settings(app).model_copy(update={"build_isolation": "rlimits-only"})
    log = BuildLog()
    assert Sandbox(app.settings, weaker).run(tree, ["sh", ".conveyor-build"], {}, Deadline(60, "t"), log, "x") == 0
    assert (tree / "made.txt").read_text() == "made\n" and "sandbox: peak" not in log.text


@pytest.mark.slow
def test_each_build_runs_as_its_own_user_so_one_that_takes_a_per_user_kernel_count_leaves_the_others_theirs(
    build_app,
    workers,
    workdir,  # noqa: F811
):
    """Every build ran as nobody: what the kernel counts per user (here inotify instances, 128 by default) was
    shared, and one tenant that took it all made another's file watcher fail. Now each build has a uid of its own."""
    app = build_app()
    store = StoreReads(app)
    workers(app)
    grab = (
        "import ctypes, os, time\n"
        "libc = ctypes.CDLL(None)\n"
        "held = []\n"
        "while len(held) < 100000 and (fd := libc.inotify_init()) >= 0:\n"
        "    held.append(fd)\n"
        "open('held.txt', 'w').write(str(len(held)))\n"
        "open('../started', 'w').close()\n"
        "while not os.path.exists('../open'):\n"
        "    time.sleep(0.05)\n"
    )
    taker = make_tree(workdir / "taker", {"grab.py": grab}, "id -u > uid.txt; python3 grab.py\n")
    taking = build(
        app,
        "upload",
        {"owner_id": "tenant-a", "agent_id": "ag-take", "archive_path": str(make_zip(taker, workdir / "t.zip"))},
        env={"MARK": "taker"},
    )
    wait_for(lambda: gate_started("taker"), timeout=60, message="the first build to take every inotify instance")
    watcher = make_tree(
        workdir / "watcher",
        {"watch.py": "import ctypes\nassert ctypes.CDLL(None).inotify_init() >= 0, 'no inotify instance left'\n"},
        "id -u > uid.txt; python3 watch.py\n",
    )
    watching = build(
        app,
        "upload",
        {"owner_id": "tenant-b", "agent_id": "ag-watch", "archive_path": str(make_zip(watcher, workdir / "w.zip"))},
    )
    (watched,) = finished(store, watching.build_id, timeout=60)
    open_gate("taker")
    (took,) = finished(store, taking.build_id, timeout=60)
    assert watched.status == "succeeded", watched.log[-1000:]  # as one shared user: 'no inotify instance left'
    assert took.status == "succeeded", took.log[-1000:]
    taken = artifact_files(app, took.artifact_sha256)
    limit = int(Path("/proc/sys/fs/inotify/max_user_instances").read_text())
    assert int(taken["held.txt"]) == limit  # it did take all its user had
    assert taken["uid.txt"] != artifact_files(app, watched.artifact_sha256)["uid.txt"]
