"""Source trees, archives, git repositories and fixtures for the build tests."""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import tarfile
import tempfile
import zipfile
from pathlib import Path

import psutil
import pytest
from cryptography.fernet import Fernet

from conveyor.app import App
from conveyor.platform.builds import store
from conveyor.platform.builds.cgroups import detect
from conveyor.platform.builds.requests import BuildTicket, request_build
from conveyor.platform.settings import PlatformSettings
from conveyor.settings import QueueOverride, Settings
from tests.support.harness import running
from tests.support.waiting import wait_for

GIT_ENV = {
    "GIT_AUTHOR_NAME": "t",
    "GIT_AUTHOR_EMAIL": "t@example.com",
    "GIT_COMMITTER_NAME": "t",
    "GIT_COMMITTER_EMAIL": "t@example.com",
    "GIT_CONFIG_NOSYSTEM": "1",
    "HOME": "/nonexistent",
    "PATH": "/usr/bin:/bin",
}


def make_tree(path: Path, files: dict[str, str], script: str | None = None) -> Path:
    """A directory holding ``files`` and, with ``script``, a .conveyor-build script."""
    path.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (path / name).parent.mkdir(parents=True, exist_ok=True)
        (path / name).write_text(text)
    if script is not None:
        (path / ".conveyor-build").write_text(script)
    return path


def make_zip(tree: Path, dest: Path) -> Path:
    with zipfile.ZipFile(dest, "w") as zf:
        for file in sorted(tree.rglob("*")):
            if file.is_file():
                zf.write(file, file.relative_to(tree).as_posix())
    return dest


def make_tgz(tree: Path, dest: Path) -> Path:
    with tarfile.open(dest, "w:gz") as tf:
        for file in sorted(tree.rglob("*")):
            tf.add(file, file.relative_to(tree).as_posix(), recursive=False)
    return dest


def make_repo(tree: Path, branch: str = "main") -> str:
    """Make ``tree`` a git repository with one commit on ``branch``; return the commit."""

    def git(*args: str) -> str:
        return subprocess.run(
            ["git", *args], cwd=tree, env=GIT_ENV, check=True, capture_output=True, text=True
        ).stdout.strip()

    git("init", "--quiet", "--initial-branch", branch)
    git("add", "-A")
    git("commit", "--quiet", "-m", "source")
    return git("rev-parse", "HEAD")


def commit_change(tree: Path, name: str, text: str) -> str:
    (tree / name).write_text(text)
    subprocess.run(["git", "add", "-A"], cwd=tree, env=GIT_ENV, check=True)
    subprocess.run(["git", "commit", "--quiet", "-m", "change"], cwd=tree, env=GIT_ENV, check=True)
    return subprocess.run(
        ["git", "rev-parse", "HEAD"], cwd=tree, env=GIT_ENV, check=True, capture_output=True, text=True
    ).stdout.strip()


KEY = Fernet.generate_key().decode()

#: The build_app fixture's admin token, as a request header.
ADMIN_AUTH = {"Authorization": "Bearer admin-token-builds-7e2d"}


@pytest.fixture
def workdir():
    # mkdtemp under /tmp, like the other fixtures: tmp_path's parent is not always enterable.
    path = Path(tempfile.mkdtemp(prefix="conveyor-builds-"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def build_app(database_url, redis_url, workdir):
    """An App with a data dir, a secret key, fast retries and short heartbeats; make(**overrides) for more."""
    made = []

    def make(**overrides) -> App:
        settings = dict(
            broker="redis",
            redis_url=redis_url,
            database_url=database_url,
            data_dir=workdir / "data",
            secret_key=KEY,
            admin_token="admin-token-builds-7e2d",
            shutdown_timeout=5,
            pg_poll_seconds=0.2,
            pg_recovery_seconds=0.5,
            pg_lease_seconds=2,
            queues={"build": QueueOverride(min_backoff=0.05, max_backoff=0.1)},
        )
        # The platform's (its builds', its provider's): short heartbeats; host-path sources may come from
        # the test's own directory only.
        platform: dict[str, object] = dict(
            build_heartbeat_interval=0.2, build_stale_after=2, build_source_roots=str(workdir)
        )
        if detect()[0] is None:
            # A host that can make no build cgroup (a non-root run): the weaker mode, said explicitly.
            platform["build_isolation"] = "rlimits-only"
        for name, value in overrides.items():  # each override to whichever settings class has the field
            (platform if name in PlatformSettings.model_fields else settings)[name] = value
        app = App(Settings(**settings), blueprint_settings=[PlatformSettings(**platform)])
        made.append(app)
        return app

    yield make
    for app in made:
        app.close()


@pytest.fixture
def workers():
    """start(app): build-queue workers in this process, on the app's broker, stopped after the test."""
    with contextlib.ExitStack() as stack:
        yield lambda app: stack.enter_context(running(app, "build"))


class StoreReads:
    """What the build tests read from the build store, each read on its own connection from the app's pool
    (so a test can look while workers write)."""

    def __init__(self, app: App) -> None:
        self.pool = app.pool

    def get(self, build_id: str) -> store.BuildRecord | None:
        with self.pool.connection() as conn:
            return store.get_build(conn, build_id)

    def events(self, build_id: str) -> list[tuple[int, str, str | None]]:
        with self.pool.connection() as conn:
            return store.build_events(conn, build_id)

    def target(self, kind: str, target_id: str) -> store.Target | None:
        with self.pool.connection() as conn:
            return store.get_target(conn, kind, target_id)

    def version(self, kind: str, target_id: str, version: str) -> tuple[str, str] | None:
        with self.pool.connection() as conn:
            return store.get_version(conn, kind, target_id, version)

    def versions(self, kind: str, target_id: str) -> list[tuple[str, str]]:
        with self.pool.connection() as conn:
            return store.list_versions(conn, kind, target_id)

    def deployment(self, kind: str, target_id: str) -> store.Deployment | None:
        with self.pool.connection() as conn:
            return store.get_deployment(conn, kind, target_id)


def finished(reads: StoreReads, *build_ids: str, timeout: float = 30):
    """Wait until every build has an outcome; return their records."""

    def done():
        records = [reads.get(b) for b in build_ids]
        return records if all(r and r.status in ("succeeded", "failed") for r in records) else None

    return wait_for(done, timeout=timeout, message=f"builds {build_ids} finished")


def build(app: App, kind: str, fields: dict, **kwargs) -> BuildTicket:
    """request_build as an operator's own code calls it: host paths allowed (under the workdir, the root)."""
    return request_build(app, kind, fields, host_paths=True, **kwargs)


#: A build script that says it started and waits for the test to open its gate. Both files live in the
#: sandbox's workspace (/tmp/build), outside the packaged tree: a sandboxed script can write nowhere else.
#: The build's env must hold MARK=<marker>: the test finds its sandbox by that.
GATED = "touch ../started; while [ ! -e ../open ]; do sleep 0.05; done\n"


def sandbox_workspace(marker: str) -> Path | None:
    """The workspace (/tmp/build) of the running build script whose env holds MARK=<marker>, as the host reaches
    it through the sandbox's root (it is a tmpfs in the sandbox's own mount namespace); None while none runs."""
    for proc in sandboxed(marker):
        try:
            if proc.cmdline()[:2] == ["sh", ".conveyor-build"]:
                return Path(f"/proc/{proc.pid}/root/tmp/build")
        except psutil.Error:
            pass
    return None


def gate_started(marker: str) -> bool:
    workspace = sandbox_workspace(marker)
    try:
        return workspace is not None and (workspace / "started").exists()
    except OSError:
        return False


def open_gate(marker: str) -> None:
    workspace = sandbox_workspace(marker)
    assert workspace is not None, f"no build script with MARK={marker} runs"
    (workspace / "open").touch()


def sandboxed(marker: str, uid: int | None = None) -> list[psutil.Process]:
    """Processes still running whose environment holds MARK=<marker> (set through a build's env), of ``uid``."""
    found = []
    for proc in psutil.process_iter():
        try:
            if proc.environ().get("MARK") == marker and (uid is None or proc.uids().real == uid):
                found.append(proc)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            pass
    return found
