-- Named queries of conveyor.platform.builds.store. Agents and connectors have one
-- query each per operation; the store picks by the build's target kind.

-- name: agent_ensure
-- Creates the target or locks it until the build's transaction ends, in one statement; no row when
-- it is another owner's (the row is locked either way, so the answer holds until commit).
INSERT INTO agents (id, owner_id) VALUES (%(id)s, %(owner_id)s)
ON CONFLICT (id) DO UPDATE SET owner_id = agents.owner_id WHERE agents.owner_id = EXCLUDED.owner_id
RETURNING id

-- name: connector_ensure
-- Creates the target or locks it until the build's transaction ends, in one statement; no row when
-- it is another owner's (the row is locked either way, so the answer holds until commit).
INSERT INTO connectors (id, owner_id) VALUES (%(id)s, %(owner_id)s)
ON CONFLICT (id) DO UPDATE SET owner_id = connectors.owner_id WHERE connectors.owner_id = EXCLUDED.owner_id
RETURNING id

-- name: agent_lock
SELECT id, owner_id, status, status_reason, repo_url, repo_branch FROM agents WHERE id = %(id)s FOR UPDATE

-- name: connector_lock
SELECT id, owner_id, status, status_reason, repo_url, repo_branch FROM connectors WHERE id = %(id)s FOR UPDATE

-- name: agent_get
SELECT id, owner_id, status, status_reason, repo_url, repo_branch FROM agents WHERE id = %(id)s

-- name: connector_get
SELECT id, owner_id, status, status_reason, repo_url, repo_branch FROM connectors WHERE id = %(id)s

-- name: agent_set_status
UPDATE agents
   SET status = %(status)s, status_reason = %(reason)s::text,
       repo_url = coalesce(%(repo_url)s::text, repo_url),
       repo_branch = CASE WHEN %(repo_url)s::text IS NULL THEN repo_branch ELSE %(repo_branch)s::text END,
       updated_at = now()
 WHERE id = %(id)s AND owner_id = %(owner_id)s

-- name: connector_set_status
UPDATE connectors
   SET status = %(status)s, status_reason = %(reason)s::text,
       repo_url = coalesce(%(repo_url)s::text, repo_url),
       repo_branch = CASE WHEN %(repo_url)s::text IS NULL THEN repo_branch ELSE %(repo_branch)s::text END,
       updated_at = now()
 WHERE id = %(id)s AND owner_id = %(owner_id)s

-- name: build_insert
INSERT INTO builds (id, kind, agent_id, connector_id, owner_id)
VALUES (%(id)s, %(kind)s, %(agent_id)s::text, %(connector_id)s::text, %(owner_id)s)
ON CONFLICT (id) DO NOTHING
RETURNING id

-- name: build_set_job
UPDATE builds SET job_id = %(job_id)s WHERE id = %(id)s AND job_id IS NULL

-- name: build_lock
SELECT status, claim, heartbeat_at IS NULL OR heartbeat_at < now() - make_interval(secs => %(stale)s) AS stale
  FROM builds WHERE id = %(id)s FOR UPDATE

-- name: build_claim
UPDATE builds
   SET status = 'building', claim = claim + 1, worker = %(worker)s, job_id = %(job_id)s,
       heartbeat_at = now(), started_at = coalesce(started_at, now())
 WHERE id = %(id)s
RETURNING claim

-- name: build_event
INSERT INTO build_events (build_id, claim, event, detail) VALUES (%(id)s, %(claim)s, %(event)s, %(detail)s::text)

-- name: build_heartbeat
UPDATE builds SET heartbeat_at = now(), log = %(log)s
 WHERE id = %(id)s AND claim = %(claim)s AND status = 'building'

-- name: build_release
UPDATE builds SET status = 'queued', heartbeat_at = NULL, error = %(error)s, log = %(log)s
 WHERE id = %(id)s AND claim = %(claim)s AND status = 'building'
RETURNING id

-- name: build_succeed
UPDATE builds
   SET status = 'succeeded', version = %(version)s, artifact_sha256 = %(artifact)s, log = %(log)s,
       error = NULL, heartbeat_at = NULL, finished_at = now()
 WHERE id = %(id)s AND claim = %(claim)s AND status = 'building'
RETURNING id

-- name: build_fail
UPDATE builds SET status = 'failed', error = %(error)s, heartbeat_at = NULL, finished_at = now()
 WHERE id = %(id)s AND status IN ('queued', 'building')
RETURNING claim, kind, agent_id, connector_id, owner_id

-- name: build_get
SELECT id, kind, agent_id, connector_id, owner_id, status, version, artifact_sha256, log, error, claim,
       worker, job_id, heartbeat_at, created_at, started_at, finished_at
  FROM builds WHERE id = %(id)s

-- name: build_events
SELECT claim, event, detail, at FROM build_events WHERE build_id = %(id)s ORDER BY id

-- name: version_get
SELECT version, artifact_sha256, build_id, env_names, created_at
  FROM build_versions WHERE target_kind = %(kind)s AND target_id = %(id)s AND version = %(version)s

-- name: version_list
SELECT version, artifact_sha256, build_id, env_names, created_at
  FROM build_versions WHERE target_kind = %(kind)s AND target_id = %(id)s ORDER BY created_at, version

-- name: version_next
SELECT 'v' || (coalesce(max(substring(version FROM '^v([0-9]{1,15})$')::bigint), 0) + 1)
  FROM build_versions WHERE target_kind = %(kind)s AND target_id = %(id)s

-- name: version_insert
INSERT INTO build_versions (target_kind, target_id, version, artifact_sha256, build_id, env_names)
VALUES (%(kind)s, %(id)s, %(version)s, %(artifact)s, %(build_id)s, %(env_names)s)
ON CONFLICT (target_kind, target_id, version) DO NOTHING

-- name: deployment_upsert
INSERT INTO deployments (target_kind, target_id, version, artifact_sha256, build_id)
VALUES (%(kind)s, %(id)s, %(version)s, %(artifact)s, %(build_id)s)
ON CONFLICT (target_kind, target_id) DO UPDATE
    SET version = EXCLUDED.version, artifact_sha256 = EXCLUDED.artifact_sha256,
        previous_version = deployments.version, build_id = EXCLUDED.build_id, updated_at = now()

-- name: deployment_get
SELECT version, artifact_sha256, previous_version, build_id, updated_at
  FROM deployments WHERE target_kind = %(kind)s AND target_id = %(id)s
