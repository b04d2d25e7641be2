-- The Postgres broker (conveyor/brokers/postgres.py): one table is the queue.
--
-- A job is one row, from enqueue to its end, across retries:
--
--   pending      waiting for a worker; available_at in the future means
--                delayed (a delay, or a retry's backoff)
--   in_progress  claimed by worker_id (FOR UPDATE SKIP LOCKED), prefetched
--                or running
--   done         finished; kept as history until CONVEYOR_RETENTION
--   failed       failed for good; its final-failure hook has run
--
-- attempt counts starts (a run that began, whether it raised, finished or
-- took its worker down); delivery counts claims and tells an ack of an
-- older delivery from the current one.

CREATE TABLE conveyor_jobs (
    id                TEXT PRIMARY KEY,            -- Dramatiq's message id
    queue             TEXT NOT NULL,
    job               TEXT NOT NULL,               -- the actor (job type) name
    status            TEXT NOT NULL DEFAULT 'pending'
                      CHECK (status IN ('pending', 'in_progress', 'done', 'failed')),
    priority          INTEGER NOT NULL DEFAULT 0,  -- lower runs first, as in Dramatiq
    attempt           INTEGER NOT NULL DEFAULT 0 CHECK (attempt >= 0),
    max_attempts      INTEGER CHECK (max_attempts > 0),
    delivery          INTEGER NOT NULL DEFAULT 0 CHECK (delivery >= 0),
    job_key           TEXT,                        -- the enqueue's dedup key
    key_expires_at    TIMESTAMPTZ,
    message           JSONB NOT NULL,              -- the encoded Dramatiq message
    error             TEXT,
    worker_id         TEXT,                        -- conveyor_workers.id while in_progress
    created_at        TIMESTAMPTZ NOT NULL DEFAULT now(),
    available_at      TIMESTAMPTZ NOT NULL DEFAULT now(),
    picked_at         TIMESTAMPTZ,                 -- last claim
    started_at        TIMESTAMPTZ,                 -- last start
    completed_at      TIMESTAMPTZ,                 -- set when done or failed
    final_failure_at  TIMESTAMPTZ,                 -- the final-failure hook was claimed
    CONSTRAINT conveyor_jobs_held CHECK ((status = 'in_progress') = (worker_id IS NOT NULL)),
    CONSTRAINT conveyor_jobs_finished CHECK ((status IN ('done', 'failed')) = (completed_at IS NOT NULL)),
    CONSTRAINT conveyor_jobs_key_ttl CHECK ((job_key IS NULL) OR (key_expires_at IS NOT NULL))
) WITH (
    -- Every job row is updated three or four times in its life: vacuum
    -- early so dead versions do not pile up in the hot part of the table.
    autovacuum_vacuum_scale_factor = 0.02,
    autovacuum_analyze_scale_factor = 0.02
);

-- The claim's scan: only rows waiting for a worker, in claim order. The
-- history (done, failed) is not in it, so a long history does not slow
-- the queue down.
CREATE INDEX conveyor_jobs_pending ON conveyor_jobs (queue, priority, available_at)
    WHERE status = 'pending';

-- Held rows: the recovery pass, the active list and counts.
CREATE INDEX conveyor_jobs_in_progress ON conveyor_jobs (queue, picked_at)
    WHERE status = 'in_progress';

-- History: listing finished jobs newest first, counting failures, pruning.
CREATE INDEX conveyor_jobs_history ON conveyor_jobs (queue, status, completed_at)
    WHERE status IN ('done', 'failed');

-- Dedup: one job per key. An expired key is released (set to NULL) by the
-- next enqueue that wants it; a pruned job releases its key with its row.
CREATE UNIQUE INDEX conveyor_jobs_job_key ON conveyor_jobs (job_key)
    WHERE job_key IS NOT NULL;

-- Worker processes and their heartbeats; a worker's rows go back to the
-- queue when its heartbeat is older than the lease (CONVEYOR_PG_LEASE_SECONDS).
CREATE TABLE conveyor_workers (
    id            TEXT PRIMARY KEY,
    hostname      TEXT NOT NULL,
    pid           INTEGER NOT NULL,
    queues        TEXT[] NOT NULL DEFAULT '{}',
    started_at    TIMESTAMPTZ NOT NULL DEFAULT now(),
    heartbeat_at  TIMESTAMPTZ NOT NULL DEFAULT now()
);

-- Lifetime totals per queue. Split over a few slots that writers pick at
-- random, so concurrent acks do not queue up on one row lock; read the sum.
CREATE TABLE conveyor_queue_totals (
    queue      TEXT NOT NULL,
    slot       SMALLINT NOT NULL CHECK (slot >= 0),
    completed  BIGINT NOT NULL DEFAULT 0,
    failed     BIGINT NOT NULL DEFAULT 0,
    PRIMARY KEY (queue, slot)
);

-- Queues whose jobs workers do not claim until resumed.
CREATE TABLE conveyor_paused_queues (
    queue      TEXT PRIMARY KEY,
    paused_at  TIMESTAMPTZ NOT NULL DEFAULT now()
);
