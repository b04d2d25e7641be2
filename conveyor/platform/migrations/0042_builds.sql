-- Agent and MCP connector builds (the agent.build job family).
-- The outcome lives here: the processor writes it, the worker reads it
-- back, and a build that fails for good drives its target to 'failed'.

-- Build targets. Until the agent platform owns agents, these are the
-- minimal rows a build needs: an owner, a status and what is deployed.
CREATE TABLE agents (
    id                 TEXT PRIMARY KEY,
    owner_id           TEXT NOT NULL,
    status             TEXT NOT NULL DEFAULT 'pending'
                       CHECK (status IN ('pending', 'building', 'active', 'failed')),
    status_reason      TEXT,
    repo_url           TEXT,
    repo_branch        TEXT,
    created_at         TIMESTAMPTZ NOT NULL DEFAULT now(),
    updated_at         TIMESTAMPTZ NOT NULL DEFAULT now()
);

CREATE TABLE connectors (
    id                 TEXT PRIMARY KEY,
    owner_id           TEXT NOT NULL,
    status             TEXT NOT NULL DEFAULT 'pending'
                       CHECK (status IN ('pending', 'building', 'active', 'failed')),
    status_reason      TEXT,
    repo_url           TEXT,
    repo_branch        TEXT,
    created_at         TIMESTAMPTZ NOT NULL DEFAULT now(),
    updated_at         TIMESTAMPTZ NOT NULL DEFAULT now()
);

-- kind is not CHECKed: the payload's tagged union validates it, and a new
-- variant must not need a migration.
CREATE TABLE builds (
    id               TEXT PRIMARY KEY,
    kind             TEXT NOT NULL,
    agent_id         TEXT REFERENCES agents (id) ON DELETE CASCADE,
    connector_id     TEXT REFERENCES connectors (id) ON DELETE CASCADE,
    owner_id         TEXT NOT NULL,
    status           TEXT NOT NULL DEFAULT 'queued'
                     CHECK (status IN ('queued', 'building', 'succeeded', 'failed')),
    version          TEXT,
    artifact_sha256  TEXT CHECK (artifact_sha256 ~ '^[0-9a-f]{64}$'),
    log              TEXT NOT NULL DEFAULT '',
    error            TEXT,
    -- Claims of this build by a worker; the fence of every later write.
    claim            INTEGER NOT NULL DEFAULT 0,
    worker           TEXT,
    job_id           TEXT,
    heartbeat_at     TIMESTAMPTZ,
    created_at       TIMESTAMPTZ NOT NULL DEFAULT now(),
    started_at       TIMESTAMPTZ,
    finished_at      TIMESTAMPTZ,
    CONSTRAINT builds_one_target CHECK ((agent_id IS NULL) <> (connector_id IS NULL)),
    CONSTRAINT builds_outcome CHECK (status <> 'succeeded' OR version IS NOT NULL)
);

CREATE INDEX builds_by_agent ON builds (agent_id, created_at) WHERE agent_id IS NOT NULL;
CREATE INDEX builds_by_connector ON builds (connector_id, created_at) WHERE connector_id IS NOT NULL;

-- Append-only history of each build's claims and its outcome.
CREATE TABLE build_events (
    id        BIGSERIAL PRIMARY KEY,
    build_id  TEXT NOT NULL REFERENCES builds (id) ON DELETE CASCADE,
    claim     INTEGER NOT NULL,
    event     TEXT NOT NULL CHECK (event IN ('claimed', 'taken_over', 'released', 'succeeded', 'failed')),
    detail    TEXT,
    at        TIMESTAMPTZ NOT NULL DEFAULT now()
);

-- A build has at most one outcome, whatever crashes and retries happen.
CREATE UNIQUE INDEX build_events_one_outcome ON build_events (build_id) WHERE event IN ('succeeded', 'failed');

-- Every version a target was built as, with its content-addressed artifact.
CREATE TABLE build_versions (
    target_kind      TEXT NOT NULL CHECK (target_kind IN ('agent', 'connector')),
    target_id        TEXT NOT NULL,
    version          TEXT NOT NULL,
    artifact_sha256  TEXT NOT NULL CHECK (artifact_sha256 ~ '^[0-9a-f]{64}$'),
    build_id         TEXT NOT NULL,
    env_names        TEXT[] NOT NULL DEFAULT '{}',
    created_at       TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY (target_kind, target_id, version)
);

-- What each target runs now; rollback points it at an earlier version.
CREATE TABLE deployments (
    target_kind       TEXT NOT NULL CHECK (target_kind IN ('agent', 'connector')),
    target_id         TEXT NOT NULL,
    version           TEXT NOT NULL,
    artifact_sha256   TEXT NOT NULL,
    previous_version  TEXT,
    build_id          TEXT NOT NULL,
    updated_at        TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY (target_kind, target_id),
    FOREIGN KEY (target_kind, target_id, version) REFERENCES build_versions (target_kind, target_id, version)
);
