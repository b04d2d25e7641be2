"""POST /api/agents/upload-and-deploy over real HTTP: a multipart zip streamed to disk under a server-made id,
built and deployed; update takes the upload id too; oversize uploads answer 413 with nothing stored, a
non-zip and a bad form answer 422 naming the field."""

from __future__ import annotations

import io
import json
import tarfile
import zipfile
from pathlib import Path

import httpx

from conveyor.platform import records
from tests.support.build_sources import (  # noqa: F401 (fixtures)
    ADMIN_AUTH,
    StoreReads,
    build_app,
    finished,
    make_tree,
    make_zip,
    workdir,
    workers,
)
from tests.support.obs_support import api_server
from tests.support.platform_support import user_key
from tests.support.waiting import wait_for

AUTH = ADMIN_AUTH
ROUTE = "/api/agents/upload-and-deploy"


def leftovers(data_dir: Path) -> list[str]:
    uploads = Path(data_dir) / "uploads"
    return sorted(p.name for p in uploads.iterdir()) if uploads.exists() else []


def artifact_members(data_dir: Path, sha256: str) -> dict[str, bytes]:
    with tarfile.open(Path(data_dir) / "artifacts" / "sha256" / f"{sha256}.tar.gz") as tf:
        return {m.name: tf.extractfile(m).read() for m in tf.getmembers() if m.isfile()}


def test_an_uploaded_zip_is_built_and_deployed_and_an_update_takes_an_upload_too(build_app, workers, workdir):  # noqa: F811
    app = build_app(upload_max_bytes=256 * 1024)
    store = StoreReads(app)
    workers(app)
    v1 = make_zip(
        make_tree(workdir / "v1", {"agent.py": "print(1)\n"}, "mkdir -p dist && cp agent.py dist/\n"),
        workdir / "v1.zip",
    )
    v2 = make_zip(make_tree(workdir / "v2", {"agent.py": "print(2)\n"}), workdir / "v2.zip")
    with api_server(app) as url, httpx.Client(base_url=url, timeout=30) as client:
        assert (
            client.post(
                ROUTE, files={"file": ("v1.zip", v1.read_bytes())}, data={"owner_id": "u", "agent_id": "ag-up"}
            ).status_code
            == 401
        )
        answer = client.post(
            ROUTE,
            headers=AUTH,
            files={"file": ("v1.zip", v1.read_bytes(), "application/zip")},
            data={"owner_id": "u", "agent_id": "ag-up", "env": json.dumps({"FLAG": "on"})},
        )
        assert answer.status_code == 202, answer.text
        ticket = answer.json()
        assert ticket["upload_id"].startswith("upl_") and ticket["status_url"] == f"/api/builds/{ticket['build_id']}"
        (record,) = finished(store, ticket["build_id"])
        assert record.status == "succeeded" and record.version == "v1"
        assert artifact_members(app.settings.data_dir, record.artifact_sha256)["dist/agent.py"] == b"print(1)\n"
        shown = client.get(ticket["status_url"], headers=AUTH).json()
        assert shown["status"] == "succeeded" and "on" not in json.dumps(shown["events"])

        # An update from an upload: through the form (kind=update) ...
        answer = client.post(
            ROUTE,
            headers=AUTH,
            files={"file": ("v2.zip", v2.read_bytes())},
            data={"owner_id": "u", "agent_id": "ag-up", "kind": "update", "version": "2.0", "changelog": "prints 2"},
        )
        assert answer.status_code == 202, answer.text
        (record,) = finished(store, answer.json()["build_id"])
        assert record.status == "succeeded" and record.version == "2.0" and "changelog: prints 2" in record.log
        assert store.deployment("agent", "ag-up").version == "2.0"
        # ... or as JSON naming an upload id (here one the upload route stored; it is used up by its build).
        stored = client.post(
            ROUTE,
            headers=AUTH,
            files={"file": ("v1.zip", v1.read_bytes())},
            data={"owner_id": "u", "agent_id": "ag-other"},
        )
        (first,) = finished(store, stored.json()["build_id"])
        assert first.status == "succeeded"
        # An upload serves one build, then goes (just after the build's outcome is recorded).
        wait_for(lambda: leftovers(app.settings.data_dir) == [], timeout=10, message="the used upload to go")
        reused = client.post(
            "/api/builds",
            headers=AUTH,
            json={"kind": "update", "owner_id": "u", "agent_id": "ag-up", "upload_id": stored.json()["upload_id"]},
        )
        assert reused.status_code == 202
        (gone,) = finished(store, reused.json()["build_id"])
        assert gone.status == "failed" and "cannot be used" in gone.error
        bad_id = client.post(
            "/api/builds",
            headers=AUTH,
            json={"kind": "update", "owner_id": "u", "agent_id": "ag-up", "upload_id": "../../etc/passwd"},
        )
        assert bad_id.status_code == 422 and "upload_id" in bad_id.text and "passwd" not in bad_id.text


def test_oversize_non_zip_and_bad_forms_are_refused_and_nothing_is_stored(build_app, workdir):  # noqa: F811
    app = build_app(upload_max_bytes=64 * 1024)
    data = Path(app.settings.data_dir)
    store = StoreReads(app)
    big = io.BytesIO()
    with zipfile.ZipFile(big, "w", zipfile.ZIP_STORED) as zf:
        zf.writestr("blob.bin", bytes(range(256)) * 1024)  # 256 KiB, stored
    fields = {"owner_id": "u", "agent_id": "ag-bad"}
    with api_server(app) as url, httpx.Client(base_url=url, timeout=30) as client:
        # Declared too large: refused before the body is read.
        oversize = client.post(ROUTE, headers=AUTH, files={"file": ("big.zip", big.getvalue())}, data=fields)
        assert oversize.status_code == 413 and "file" in oversize.text
        # Streamed without a length (chunked): cut off at the cap while it arrives.
        request = client.build_request(
            "POST", ROUTE, headers=AUTH, files={"file": ("big.zip", big.getvalue())}, data=fields
        )
        body = request.read()
        headers = {**AUTH, "content-type": request.headers["content-type"]}

        def chunks():
            for at in range(0, len(body), 8192):
                yield body[at : at + 8192]

        streamed = client.post(ROUTE, headers=headers, content=chunks())
        assert streamed.status_code == 413
        assert leftovers(data) == []

        not_zip = client.post(
            ROUTE, headers=AUTH, files={"file": ("a.zip", b"this is not a zip archive\n")}, data=fields
        )
        assert not_zip.status_code == 422 and "file" in not_zip.text and "zip" in not_zip.text
        missing = client.post(ROUTE, headers=AUTH, data=fields, files={"zq9other": ("x", b"y")})
        # The form's fields are listed; the stranger's name (the client's input) is not echoed.
        assert missing.status_code == 422 and "unknown field" in missing.text and "agent_id" in missing.text
        assert "zq9other" not in missing.text
        control = client.post(
            ROUTE, headers=AUTH, data={**fields, "version": "1"}, files={"file": ("a.zip", _tiny_zip())}
        ).status_code
        assert control == 202  # the control: the same form with a good file is taken
        no_agent = client.post(ROUTE, headers=AUTH, data={"owner_id": "u"}, files={"file": ("a.zip", _tiny_zip())})
        assert no_agent.status_code == 422 and "agent_id" in no_agent.text
        # The last: a lone surrogate, which json.loads lets through and no UTF-8 encoder takes.
        for env in ("[1, 2]", "[" * 30000 + "]" * 30000, '{"A": 1}', '{"A": "zq9\\ud800"}'):
            bad_env = client.post(
                ROUTE, headers=AUTH, data={**fields, "env": env}, files={"file": ("a.zip", _tiny_zip())}
            )
            assert bad_env.status_code == 422 and "env" in bad_env.text and "zq9" not in bad_env.text
        # The same value in POST /api/builds' JSON body: refused at the door (the guard refuses a lone
        # surrogate in any JSON body, which Postgres could not store), before the route could name the field.
        surrogate = b'{"kind": "upload", "owner_id": "u", "agent_id": "ag-bad", "upload_id": "upl_x", "env": {"A": "zq9\\ud800"}}'
        bad_env = client.post("/api/builds", headers={**AUTH, "content-type": "application/json"}, content=surrogate)
        assert bad_env.status_code == 400 and "surrogate" in bad_env.text and "zq9" not in bad_env.text
        plain = client.post(ROUTE, headers=AUTH, json=fields)
        assert plain.status_code == 415
        nul = client.post(
            ROUTE, headers=AUTH, data={"owner_id": "u", "agent_id": "a\x00b"}, files={"file": ("a.zip", _tiny_zip())}
        )
        assert nul.status_code == 422 and "agent_id" in nul.text and "Traceback" not in nul.text
    # Only the one good upload was kept (its build is queued; no worker runs here).
    assert len(leftovers(data)) == 1 and leftovers(data)[0].startswith("upl_")
    assert store.target("agent", "ag-bad") is not None


def test_a_users_key_uploads_for_that_user_only_and_the_upload_route_has_its_own_body_cap(build_app, workdir):  # noqa: F811
    # The API's JSON cap is far below the upload's: the upload route is allowed its own for its multipart
    # form (Guard.body_limits); the JSON cap may be no smaller than a payload, so that is lowered too.
    app = build_app(upload_max_bytes=256 * 1024, api_max_json_bytes=16 * 1024, max_payload_bytes=16 * 1024)
    data = Path(app.settings.data_dir)
    store = StoreReads(app)
    alice, bob = user_key(app, "alice-up"), user_key(app, "bob-up")
    archive = io.BytesIO()
    with zipfile.ZipFile(archive, "w", zipfile.ZIP_STORED) as zf:
        zf.writestr("agent.py", "run()\n")
        zf.writestr("blob.bin", bytes(range(256)) * 256)  # 64 KiB stored: past the API's cap, inside the upload's
    zipped = archive.getvalue()
    with api_server(app) as url, httpx.Client(base_url=url, timeout=30) as client:
        # The key's user owns the upload's build and its agent; owner_id may be left out.
        mine = client.post(ROUTE, headers=alice, data={"agent_id": "ag-alice"}, files={"file": ("a.zip", zipped)})
        assert mine.status_code == 202, mine.text
        build_id = mine.json()["build_id"]
        ag_alice = records.scoped_id("agent", "alice-up", "ag-alice")  # her "ag-alice", nobody else's
        assert store.get(build_id).owner_id == "alice-up" and store.target("agent", ag_alice).owner_id == "alice-up"
        assert store.get(build_id).agent_id == ag_alice
        assert client.get(f"/api/builds/{build_id}", headers=alice).status_code == 200
        assert client.get(f"/api/builds/{build_id}", headers=bob).status_code == 404  # another's: as missing
        kept = leftovers(data)
        assert len(kept) == 1
        # Naming another owner is refused, naming the field ...
        owner = client.post(
            ROUTE, headers=bob, data={"agent_id": "ag-bob", "owner_id": "alice-up"}, files={"file": ("a.zip", zipped)}
        )
        assert owner.status_code == 422 and "owner_id" in owner.text
        # ... and another user's agent (the admin token naming raw ids) answers 404, as one that does not
        # exist (checked in the build's own transaction); neither upload is kept.
        foreign = client.post(
            ROUTE,
            headers=AUTH,
            data={"agent_id": ag_alice, "owner_id": "bob-up", "kind": "update"},
            files={"file": ("a.zip", zipped)},
        )
        assert foreign.status_code == 404 and foreign.json()["detail"] == "no such agent", foreign.text
        assert leftovers(data) == kept and store.target("agent", ag_alice).owner_id == "alice-up"
        # Bob's own "ag-alice" is his: another agent, and hers is untouched.
        his = client.post(ROUTE, headers=bob, data={"agent_id": "ag-alice"}, files={"file": ("a.zip", zipped)})
        assert his.status_code == 202, his.text
        assert store.get(his.json()["build_id"]).agent_id == records.scoped_id("agent", "bob-up", "ag-alice")
        assert store.target("agent", ag_alice).owner_id == "alice-up"
        # The admin token still names the owner.
        unowned = client.post(ROUTE, headers=AUTH, data={"agent_id": "ag-admin"}, files={"file": ("a.zip", zipped)})
        assert unowned.status_code == 422 and "owner_id" in unowned.text
        # Every other route keeps the API's cap.
        big_json = client.post("/api/builds", headers=alice, json={"kind": "upload", "agent_id": "x" * 20_000})
        assert big_json.status_code == 413


def _tiny_zip() -> bytes:
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as zf:
        zf.writestr("agent.py", "run()\n")
    return out.getvalue()


def test_a_partial_upload_left_by_a_dead_api_process_is_swept_and_a_fresh_one_is_not(workdir):  # noqa: F811
    import os
    import time

    from conveyor.platform.builds.uploads import PART_MAX_AGE, Uploads

    uploads = Uploads(workdir / "data")
    uploads.root.mkdir(parents=True)
    old, fresh = uploads.root / ".part-old", uploads.root / ".part-fresh"
    old.write_bytes(b"x" * 10)
    fresh.write_bytes(b"y" * 10)
    then = time.time() - PART_MAX_AGE - 60
    os.utime(old, (then, then))
    writer = uploads.writer(1024)
    writer.abort()
    assert not old.exists() and fresh.exists()
