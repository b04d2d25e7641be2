-- The agent platform's records: tasks and their messages, runs and the
-- chunks they stream, memories, and resources indexed for full-text search.
-- Every row is found by its ID; order is by creation time only where a
-- conversation is replayed to the model.

CREATE TABLE tasks (
    id            TEXT PRIMARY KEY,
    user_id       TEXT NOT NULL,
    -- 'task': one instruction carried out per run; 'chat': a conversation.
    kind          TEXT NOT NULL DEFAULT 'chat' CHECK (kind IN ('task', 'chat')),
    title         TEXT NOT NULL DEFAULT '',
    instructions  TEXT NOT NULL DEFAULT '',
    created_at    TIMESTAMPTZ NOT NULL DEFAULT now()
);

CREATE INDEX tasks_by_user ON tasks (user_id, created_at);

CREATE TABLE messages (
    id                 TEXT PRIMARY KEY,
    task_id            TEXT NOT NULL REFERENCES tasks (id),
    role               TEXT NOT NULL CHECK (role IN ('system', 'user', 'assistant')),
    content            TEXT NOT NULL,
    -- The run that wrote an assistant message.
    run_id             TEXT,
    prompt_tokens      INTEGER CHECK (prompt_tokens >= 0),
    completion_tokens  INTEGER CHECK (completion_tokens >= 0),
    created_at         TIMESTAMPTZ NOT NULL DEFAULT clock_timestamp(),
    updated_at         TIMESTAMPTZ NOT NULL DEFAULT clock_timestamp()
);

-- Replaying a conversation reads a task's messages in creation order.
CREATE INDEX messages_by_task ON messages (task_id, created_at, id);

CREATE TABLE runs (
    id                    TEXT PRIMARY KEY,
    task_id               TEXT NOT NULL REFERENCES tasks (id),
    job                   TEXT NOT NULL CHECK (job IN ('task.run', 'chat.run')),
    user_message_id       TEXT NOT NULL REFERENCES messages (id),
    -- Chosen when the run is created, so every attempt writes the same row.
    assistant_message_id  TEXT NOT NULL UNIQUE,
    status                TEXT NOT NULL DEFAULT 'queued'
                          CHECK (status IN ('queued', 'running', 'completed', 'failed', 'cancelled')),
    attempts              INTEGER NOT NULL DEFAULT 0 CHECK (attempts >= 0),
    prompt_tokens         INTEGER CHECK (prompt_tokens >= 0),
    completion_tokens     INTEGER CHECK (completion_tokens >= 0),
    total_tokens          INTEGER CHECK (total_tokens >= 0),
    error                 TEXT,
    created_at            TIMESTAMPTZ NOT NULL DEFAULT now(),
    started_at            TIMESTAMPTZ,
    finished_at           TIMESTAMPTZ,
    finalized_at          TIMESTAMPTZ,
    -- A terminal run has a finish time, a live one has none.
    CONSTRAINT runs_finished_when_terminal CHECK (
        (status IN ('completed', 'failed', 'cancelled')) = (finished_at IS NOT NULL)
    ),
    CONSTRAINT runs_usage_when_completed CHECK (status <> 'completed' OR total_tokens IS NOT NULL)
);

CREATE INDEX runs_by_task ON runs (task_id, created_at);
CREATE INDEX runs_live ON runs (created_at) WHERE status IN ('queued', 'running');

-- The Postgres stream buffer (postgres and embedded deployments): what a
-- run streamed, by position. (run_id, seq) is the key, so an attempt that
-- re-runs after a crash cannot add a chunk a reader already has.
CREATE TABLE run_chunks (
    run_id      TEXT NOT NULL,
    seq         INTEGER NOT NULL CHECK (seq >= 1),
    kind        TEXT NOT NULL CHECK (kind IN ('chunk', 'end')),
    data        TEXT NOT NULL,
    created_at  TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY (run_id, seq)
);

-- A stream ends once.
CREATE UNIQUE INDEX run_chunks_one_end ON run_chunks (run_id) WHERE kind = 'end';

-- What the model learnt about a user, one value per key (upserted).
CREATE TABLE memories (
    user_id            TEXT NOT NULL,
    key                TEXT NOT NULL CHECK (length(key) BETWEEN 1 AND 100),
    value              TEXT NOT NULL,
    source_task_id     TEXT NOT NULL,
    source_message_id  TEXT NOT NULL,
    created_at         TIMESTAMPTZ NOT NULL DEFAULT now(),
    updated_at         TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY (user_id, key)
);

-- One row per extracted round: when it ran (clock_timestamp, so overlaps
-- across worker processes can be measured) and how many memories it wrote.
CREATE TABLE memory_extractions (
    message_id   TEXT PRIMARY KEY,
    task_id      TEXT NOT NULL,
    user_id      TEXT NOT NULL,
    memories     INTEGER NOT NULL CHECK (memories >= 0),
    started_at   TIMESTAMPTZ NOT NULL,
    finished_at  TIMESTAMPTZ NOT NULL CHECK (finished_at >= started_at)
);

CREATE TABLE resources (
    id               TEXT PRIMARY KEY,
    user_id          TEXT NOT NULL,
    task_id          TEXT,
    title            TEXT NOT NULL DEFAULT '',
    body             TEXT NOT NULL,
    -- A digest of title and body: indexing the version already indexed is a no-op.
    version          TEXT NOT NULL,
    indexed_version  TEXT,
    indexed_at       TIMESTAMPTZ,
    created_at       TIMESTAMPTZ NOT NULL DEFAULT now(),
    updated_at       TIMESTAMPTZ NOT NULL DEFAULT now()
);

CREATE TABLE resource_chunks (
    resource_id  TEXT NOT NULL REFERENCES resources (id) ON DELETE CASCADE,
    seq          INTEGER NOT NULL CHECK (seq >= 1),
    version      TEXT NOT NULL,
    body         TEXT NOT NULL,
    tsv          TSVECTOR GENERATED ALWAYS AS (to_tsvector('english', body)) STORED,
    PRIMARY KEY (resource_id, seq)
);

CREATE INDEX resource_chunks_fts ON resource_chunks USING GIN (tsv);

-- Fixed-window request counters of the provider rate limit (postgres deployments).
CREATE TABLE rate_windows (
    name          TEXT NOT NULL,
    window_start  TIMESTAMPTZ NOT NULL,
    hits          INTEGER NOT NULL CHECK (hits >= 1),
    PRIMARY KEY (name, window_start)
);
