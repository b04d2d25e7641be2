"""Build secrets reach the build script and nothing else: no log, API response, dashboard, webhook, job record or table."""

from __future__ import annotations

import hashlib
import json
import logging

import httpx
import redis
from cryptography.fernet import Fernet

from conveyor.secrets import looks_encrypted
from tests.support.build_sources import StoreReads, build_app, finished, make_tree, make_zip, workdir, workers  # noqa: F401 (fixtures)
from tests.support.obs_support import Receiver, api_server
from tests.support.waiting import wait_for

SECRET = "sk-live-7f3a9c1e5b2d4f60"
ROTATED_OUT = "pw-from-a-removed-key-93ab"


def test_secrets_appear_in_no_log_api_response_job_record_or_table(
    build_app,
    workers,
    workdir,
    caplog,  # noqa: F811
    database_url,
    redis_url,
):
    receiver = Receiver()
    app = build_app(job_failure_webhook_url=receiver.url, webhook_format="generic", webhook_backoff=0.05)
    # The whole API (admin routes, dashboard, builds) on uvicorn.
    with api_server(app) as url, httpx.Client(base_url=url, timeout=30) as client:
        auth = {"Authorization": "Bearer admin-token-builds-7e2d"}
        # The script proves it got the value (its sha256) and tries to print it.
        script = 'echo "key is $API_KEY"; printf %s "$API_KEY" | sha256sum; echo "old is ${OLD_PASSWORD:-unset}"\n'
        archive = make_zip(make_tree(workdir / "src", {"agent.py": "run()\n"}, script), workdir / "src.zip")
        # A failing build that prints the secret: the error travels to the row, the agent, the job record, the logs.
        leaky = make_zip(
            make_tree(workdir / "leaky", {"a.py": "\n"}, 'echo "bad key $API_KEY" >&2; exit 1\n'), workdir / "leaky.zip"
        )
        # A value encrypted under a key the workers no longer have: dropped with a warning, the build goes on.
        stale = Fernet(Fernet.generate_key()).encrypt(ROTATED_OUT.encode()).decode()
        caplog.set_level(logging.DEBUG)
        workers(app)

        form = {"owner_id": "u1", "agent_id": "agent-s", "env": json.dumps({"API_KEY": SECRET})}
        upload = "/api/agents/upload-and-deploy"
        assert client.post(upload, data=form, files={"file": archive.read_bytes()}).status_code == 401
        # Over HTTP a source is an upload: a host path is refused, naming the field.
        body = {
            "kind": "upload",
            "owner_id": "u1",
            "agent_id": "agent-s",
            "archive_path": str(archive),
            "env": {"API_KEY": SECRET},
        }
        bad = client.post("/api/builds", json=body, headers=auth)
        assert bad.status_code == 422 and "archive_path" in bad.text and "host paths" in bad.text
        accepted = client.post(upload, data=form, files={"file": ("src.zip", archive.read_bytes())}, headers=auth)
        assert accepted.status_code == 202
        build_id = accepted.json()["build_id"]
        failing = client.post(
            upload,
            headers=auth,
            data={**form, "agent_id": "agent-leaky"},
            files={"file": ("leaky.zip", leaky.read_bytes())},
        )
        assert failing.status_code == 202
        # The stale value goes straight into a job, as an older producer would have enqueued it.
        with app.pool.connection() as conn:
            conn.execute("INSERT INTO agents (id, owner_id) VALUES ('agent-s2', 'u1')")
            conn.execute(
                "INSERT INTO builds (id, kind, agent_id, owner_id) VALUES ('b-stale', 'upload', 'agent-s2', 'u1')"
            )
        app.jobs.enqueue(
            "agent.build",
            {
                "kind": "upload",
                "build_id": "b-stale",
                "owner_id": "u1",
                "agent_id": "agent-s2",
                "archive_path": str(archive),
                "env": {"OLD_PASSWORD": stale},
            },
        )
        store = StoreReads(app)
        record, stale_record, failed = finished(store, build_id, "b-stale", failing.json()["build_id"])
        assert record.status == stale_record.status == "succeeded"
        assert failed.status == "failed" and "bad key [redacted]" in failed.error
        assert "bad key [redacted]" in store.target("agent", "agent-leaky").status_reason
        wait_for(
            lambda: app.broker.get_job(failing.json()["job_id"]).state == "failed",
            timeout=10,
            message="the failed job's record",
        )
        wait_for(receiver.count, timeout=20, message="the failure alert")
        receiver.close()
        assert "key is [redacted]" in record.log
        assert hashlib.sha256(SECRET.encode()).hexdigest() in record.log  # the script saw the real value
        assert "old is unset" in stale_record.log
        dropped = [
            json.loads(r.getMessage())
            for r in caplog.records
            if r.name == "conveyor.events" and '"secret_dropped"' in r.getMessage()
        ]
        assert [(d["variable"], d["job"]) for d in dropped] == [("OLD_PASSWORD", "agent.build")]

        responses = [
            accepted.text,
            bad.text,
            failing.text,
            client.get(f"/api/builds/{failed.id}", headers=auth).text,
            client.get(f"/api/builds/{build_id}", headers=auth).text,
            client.get("/api/builds/b-stale", headers=auth).text,
            client.get("/api/deployments/agent/agent-s", headers=auth).text,
            client.get(f"/admin/jobs/{failing.json()['job_id']}", headers=auth).text,
        ]
        # The admin API shows the jobs' payloads with env redacted; the dashboard likewise.
        admin_views = [
            client.get(f"/api/admin/jobs/{ref.json()['job_id']}", headers=auth).json() for ref in (accepted, failing)
        ]
        assert all(view["payload"]["env"] == "[redacted]" for view in admin_views)
        # The failure alert sent to chat says why, masked.
        alerts = [r["body"] for r in receiver.requests]
        assert any("bad key [redacted]" in alert for alert in alerts)
        responses += [json.dumps(admin_views), *alerts]
        # The job record (what the dashboard and the failure webhook read) holds the ciphertext only,
        # under the payload's secret_fields; the dashboard and webhook must redact those.
        job = app.broker.get_job(accepted.json()["job_id"])
        assert looks_encrypted(job.payload["env"]["API_KEY"])
        client_redis = redis.Redis.from_url(redis_url)
        stored_in_redis = []
        for key in client_redis.scan_iter():
            kind = client_redis.type(key)
            if kind == b"hash":
                stored_in_redis += client_redis.hvals(key)
            elif kind == b"string":
                stored_in_redis.append(client_redis.get(key))
            elif kind == b"list":
                stored_in_redis += client_redis.lrange(key, 0, -1)
        client_redis.close()
        with app.pool.connection() as conn:
            tables = [
                row[0]
                for row in conn.execute(
                    "SELECT row_to_json(t)::text FROM (SELECT * FROM builds) t UNION ALL "
                    "SELECT row_to_json(t)::text FROM (SELECT * FROM build_events) t UNION ALL "
                    "SELECT row_to_json(t)::text FROM (SELECT * FROM build_versions) t UNION ALL "
                    "SELECT row_to_json(t)::text FROM (SELECT * FROM agents) t"
                )
            ]
        everything = "\n".join(
            [caplog.text, *responses, *tables, *(v.decode(errors="replace") for v in stored_in_redis)]
        )
        for value in (SECRET, ROTATED_OUT):
            assert value not in everything
        assert '"env_names":["API_KEY"]' in "".join(tables)
