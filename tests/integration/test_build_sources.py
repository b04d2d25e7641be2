"""Where a build may take its source from, and how big it may be: ids that cannot become paths, host paths only
under configured roots (and never over HTTP), one answer for every unusable source, caps on copies and
extraction, and corrupt input failing at once instead of being retried."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import httpx
import pytest

from conveyor.errors import InvalidPayload
from conveyor.platform.builds.local import LocalBuilder
from conveyor.platform.builds.paths import inside
from conveyor.platform.builds.unpack import UNUSABLE
from conveyor.platform.errors import UnsafePath
from conveyor.platform.settings import platform_settings
from tests.support.build_sources import (  # noqa: F401 (fixtures)
    ADMIN_AUTH,
    StoreReads,
    build,
    build_app,
    finished,
    make_tgz,
    make_tree,
    make_zip,
    workdir,
    workers,
)
from tests.support.obs_support import api_server

AUTH = ADMIN_AUTH


def test_a_build_id_that_could_be_a_path_is_refused_and_the_data_dir_survives(build_app, workers, workdir):  # noqa: F811
    app = build_app()
    workers(app)
    data = Path(app.settings.data_dir)
    data.mkdir(parents=True, exist_ok=True)
    (data / "canary").write_text("keep me\n")
    one = make_tree(workdir / "one", {"a.py": "1\n"})
    (first,) = finished(
        StoreReads(app),
        build(
            app, "upload", {"owner_id": "u", "agent_id": "ag", "archive_path": str(make_zip(one, workdir / "1.zip"))}
        ).build_id,
    )
    assert first.status == "succeeded"
    with api_server(app) as url, httpx.Client(base_url=url, timeout=30) as client:
        for bad in ("..", ".", "../builds", "a/b", "/etc", "x.y", "..\\.."):
            answer = client.post(
                "/api/builds",
                headers=AUTH,
                json={"kind": "rollback", "owner_id": "u", "agent_id": "ag", "target_version": "v1", "build_id": bad},
            )
            assert answer.status_code == 422, bad
            assert "build_id" in answer.text and "Traceback" not in answer.text
    with pytest.raises(InvalidPayload, match="build_id"):
        build(app, "rollback", {"owner_id": "u", "agent_id": "ag", "target_version": "v1"}, build_id="..")
    assert (data / "canary").read_text() == "keep me\n"
    assert (data / "artifacts" / "sha256" / f"{first.artifact_sha256}.tar.gz").is_file()
    # The builder itself refuses, whatever a payload says.
    builder = LocalBuilder(app.settings, platform_settings(app))
    for bad in ("..", ".", "a/b", "../x"):
        with pytest.raises(UnsafePath):
            with builder.workspace(bad, 1):
                pass
    assert (data / "canary").exists()
    # The one check every path goes through: resolved (symlinks too), strictly under its root.
    root = workdir / "root"
    root.mkdir()
    (root / "out").symlink_to("/etc")
    assert inside(root, "ok") == (root / "ok").resolve()
    for parts in ((".."), ("out", "passwd"), ("a", "..", ".."), ("/etc",), (".",)):
        with pytest.raises(UnsafePath):
            inside(root, *parts)


def test_http_requests_name_no_host_path(build_app, workdir):  # noqa: F811
    app = build_app()
    store = StoreReads(app)
    with api_server(app) as url, httpx.Client(base_url=url, timeout=30) as client:
        for body, field in [
            ({"kind": "update", "agent_id": "ag", "source_dir": "/etc"}, "source_dir"),
            ({"kind": "upload", "agent_id": "ag", "archive_path": "/etc/passwd"}, "archive_path"),
            ({"kind": "github_clone", "agent_id": "ag", "repo_url": "/root/private"}, "repo_url"),
            ({"kind": "standalone_build", "agent_id": "ag", "git_url": "file:///srv/repo"}, "git_url"),
            (
                {"kind": "mcp_upload", "connector_id": "c", "source": {"type": "archive", "path": "/etc/x.zip"}},
                "source.path",
            ),
            ({"kind": "mcp_upload", "connector_id": "c", "source": {"type": "git", "url": "/srv/mcp"}}, "source.url"),
        ]:
            answer = client.post("/api/builds", headers=AUTH, json={**body, "owner_id": "u"})
            assert answer.status_code == 422 and field in answer.text and "host paths" in answer.text, body
            assert "/etc" not in answer.text and "/srv" not in answer.text and "/root" not in answer.text
    assert store.target("agent", "ag") is None  # nothing recorded


def test_every_unusable_source_fails_at_once_with_one_message(build_app, workers, workdir):  # noqa: F811
    # max_attempts 3 (the default): a source that can never work must not use them.
    app = build_app(build_max_source_bytes=1024**2, build_max_source_files=50)
    store = StoreReads(app)
    workers(app)
    good = make_tree(workdir / "good", {"agent.py": "run()\n", "lib/x.py": "x = 1\n"})
    good_zip = make_zip(good, workdir / "good.zip")
    # Corrupt: a member's data flipped (CRC mismatch), and a tarball cut short.
    corrupt = workdir / "corrupt.zip"
    raw = bytearray(good_zip.read_bytes())
    offset = raw.index(b"run()")
    raw[offset : offset + 5] = b"XXXXX"
    corrupt.write_bytes(bytes(raw))
    truncated = workdir / "truncated.tgz"
    big = make_tree(workdir / "bigtree", {"data.txt": os.urandom(200_000).hex()})
    truncated.write_bytes(make_tgz(big, workdir / "full.tgz").read_bytes()[:50_000])
    # A zip bomb: 50 MB of zeros in a few kilobytes; and a zip of too many small files.
    bomb = workdir / "bomb.zip"
    with zipfile.ZipFile(bomb, "w", zipfile.ZIP_DEFLATED) as zf:
        zf.writestr("zeros.bin", b"\0" * (50 * 1024**2))
    many = workdir / "many.zip"
    with zipfile.ZipFile(many, "w") as zf:
        for n in range(200):
            zf.writestr(f"f{n}.txt", "x")
    # A tar whose member climbs out; a directory over the byte cap; a directory that is a link out of the root.
    climbing = workdir / "climb.tar"
    with tarfile.open(climbing, "w") as tf:
        info = tarfile.TarInfo("../../escaped.txt")
        info.size = 3
        tf.addfile(info, io.BytesIO(b"bad"))
    huge_dir = make_tree(workdir / "huge", {f"part{n}.bin": "y" * 400_000 for n in range(4)})
    (workdir / "etc-link").symlink_to("/etc")
    # A zip the disk cannot hold as given: a name longer than any file system allows, a file where a dir must be.
    long_name = workdir / "long.zip"
    with zipfile.ZipFile(long_name, "w") as zf:
        zf.writestr("n" * 300 + ".txt", "x")
    clash = workdir / "clash.zip"
    with zipfile.ZipFile(clash, "w") as zf:
        zf.writestr("lib", "a file")
        zf.writestr("lib/x.py", "x = 1\n")
    not_archive = workdir / "notes.txt"
    not_archive.write_text("just text\n")
    sources = {
        "corrupt zip": {"archive_path": str(corrupt)},
        "truncated tgz": {"archive_path": str(truncated)},
        "zip bomb": {"archive_path": str(bomb)},
        "too many files": {"archive_path": str(many)},
        "climbing tar": {"archive_path": str(climbing)},
        "name too long": {"archive_path": str(long_name)},
        "file where a directory must be": {"archive_path": str(clash)},
        "not an archive": {"archive_path": str(not_archive)},
        "missing file": {"archive_path": str(workdir / "nope.zip")},
        "outside the roots": {"archive_path": "/etc/passwd"},
        "host directory": {"source_dir": "/etc"},
        "link out of the root": {"source_dir": str(workdir / "etc-link")},
        "directory over the cap": {"source_dir": str(huge_dir)},
        "repository outside the roots": {"repo_url": "/usr"},
    }
    tickets = {}
    for n, (name, fields) in enumerate(sources.items()):
        kind = "github_clone" if "repo_url" in fields else "update" if "source_dir" in fields else "upload"
        tickets[name] = build(app, kind, {"owner_id": "u", "agent_id": f"ag-{n}", **fields})
    records = finished(store, *(t.build_id for t in tickets.values()), timeout=60)
    for name, record in zip(sources, records):
        assert record.status == "failed", name
        assert record.error.endswith(UNUSABLE), (name, record.error)
        assert [e for _, e, _ in store.events(record.id)] == ["claimed", "released", "failed"], name
        assert "/etc" not in record.log and "passwd" not in record.log, name
    assert len({r.error for r in records}) == 1  # nothing tells one reason from another
    assert not (workdir / "escaped.txt").exists() and not (Path(app.settings.data_dir) / "escaped.txt").exists()
    # The same source, whole, builds.
    (ok,) = finished(
        store, build(app, "upload", {"owner_id": "u", "agent_id": "ag-ok", "archive_path": str(good_zip)}).build_id
    )
    assert ok.status == "succeeded"


def test_a_tree_the_build_script_grows_past_the_caps_is_not_packaged(build_app, workers, workdir):  # noqa: F811
    app = build_app(build_max_source_bytes=256 * 1024, build_max_file_bytes=10 * 1024**2)
    store = StoreReads(app)
    workers(app)
    tree = make_tree(workdir / "grows", {"a.py": "x\n"}, "head -c 300000 /dev/zero > blob.bin\n")
    (record,) = finished(
        store,
        build(
            app,
            "upload",
            {"owner_id": "u", "agent_id": "ag-grow", "archive_path": str(make_zip(tree, workdir / "g.zip"))},
        ).build_id,
    )
    assert record.status == "failed" and "larger than the limits" in record.error
    assert not any(Path(app.settings.data_dir, "artifacts", "sha256").glob("*.tar.gz"))


def test_the_cli_takes_host_paths_under_the_source_roots_and_env_by_name(
    build_app,
    workers,
    workdir,  # noqa: F811
    clean_env,
    database_url,
    redis_url,
):
    app = build_app()
    store = StoreReads(app)
    workers(app)
    tree = make_tree(workdir / "cli-src", {"agent.py": "run()\n"}, 'test "$API_KEY" = cli-secret-value\n')
    env = {
        **os.environ,
        "REDIS_URL": redis_url,
        "DATABASE_URL": database_url,
        "CONVEYOR_BROKER": "redis",
        "CONVEYOR_SECRET_KEY": app.settings.secret_key.get_secret_value(),
        "API_KEY": "cli-secret-value",
        "CONVEYOR_DATA_DIR": str(app.settings.data_dir),
    }

    def cli(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-m", "conveyor", "build", *args], env=env, capture_output=True, text=True, timeout=60
        )

    done = cli(
        "update", json.dumps({"owner_id": "u", "agent_id": "ag-cli", "source_dir": str(tree)}), "--env", "API_KEY"
    )
    assert done.returncode == 0, done.stderr
    ticket = json.loads(done.stdout)
    (record,) = finished(store, ticket["build_id"])
    assert record.status == "succeeded"  # the script saw API_KEY's value
    assert "cli-secret-value" not in done.stdout + done.stderr + record.log
    # Outside the worker's roots: enqueued (the CLI is the operator's), refused by the worker.
    outside = cli("update", json.dumps({"owner_id": "u", "agent_id": "ag-cli2", "source_dir": "/etc"}))
    assert outside.returncode == 0, outside.stderr
    (refused,) = finished(store, json.loads(outside.stdout)["build_id"])
    assert refused.status == "failed" and refused.error.endswith(UNUSABLE)
    unset = cli("update", json.dumps({"owner_id": "u", "agent_id": "ag-cli3"}), "--env", "NOT_SET_ANYWHERE")
    assert unset.returncode == 2 and "NOT_SET_ANYWHERE" in unset.stderr and "Traceback" not in unset.stderr
