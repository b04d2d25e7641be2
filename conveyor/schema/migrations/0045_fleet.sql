-- The worker registry, attempt history and enqueue totals of the Postgres
-- broker (conveyor/brokers/fleet/postgres_store.py), beside its own tables.

-- One row per worker process, written by the process itself at boot and at
-- each heartbeat (conveyor/middleware/fleet.py). Unlike
-- conveyor_workers (the broker's leases), a row stays after the worker left,
-- marked gone, so the Workers page can say when.
CREATE TABLE conveyor_fleet_workers (
    id            TEXT PRIMARY KEY,
    host          TEXT NOT NULL,
    pid           INTEGER NOT NULL,
    queues        TEXT[] NOT NULL DEFAULT '{}',
    threads       INTEGER NOT NULL DEFAULT 0,
    version       TEXT NOT NULL DEFAULT '',
    started_at    TIMESTAMPTZ NOT NULL DEFAULT now(),
    heartbeat_at  TIMESTAMPTZ NOT NULL DEFAULT now(),
    in_flight     TEXT[] NOT NULL DEFAULT '{}',
    done          BIGINT NOT NULL DEFAULT 0,
    failed        BIGINT NOT NULL DEFAULT 0,
    gone_at       TIMESTAMPTZ,
    gone_reason   TEXT
);

-- Every attempt of a job: one row per start (token: the delivery as the
-- worker saw it), completed by its end. An attempt whose worker died keeps
-- no end. Pruned with the jobs' retention.
CREATE TABLE conveyor_job_attempts (
    job_id      TEXT NOT NULL,
    token       TEXT NOT NULL,
    attempt     INTEGER NOT NULL,
    worker      TEXT NOT NULL,
    started_at  TIMESTAMPTZ,
    ended_at    TIMESTAMPTZ,
    outcome     TEXT,
    error       TEXT,
    traceback   TEXT,
    PRIMARY KEY (job_id, token)
);

CREATE INDEX conveyor_job_attempts_started ON conveyor_job_attempts (started_at);

-- Jobs enqueued, by queue and job type, counted by the insert itself: exact
-- for any producer (CLI, scripts, an enqueue inside the caller's
-- transaction counts if and only if it commits). Slots as in
-- conveyor_queue_totals, so concurrent enqueues do not queue on one row.
CREATE TABLE conveyor_enqueue_totals (
    queue     TEXT NOT NULL,
    job       TEXT NOT NULL,
    slot      SMALLINT NOT NULL CHECK (slot >= 0),
    enqueued  BIGINT NOT NULL DEFAULT 0,
    PRIMARY KEY (queue, job, slot)
);

CREATE FUNCTION conveyor_count_enqueued() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO conveyor_enqueue_totals AS t (queue, job, slot, enqueued)
    SELECT queue, job, floor(random() * 8)::smallint, count(*) FROM inserted GROUP BY queue, job
    ON CONFLICT (queue, job, slot) DO UPDATE SET enqueued = t.enqueued + EXCLUDED.enqueued;
    RETURN NULL;
END
$$;

CREATE TRIGGER conveyor_jobs_count_enqueued AFTER INSERT ON conveyor_jobs
    REFERENCING NEW TABLE AS inserted FOR EACH STATEMENT EXECUTE FUNCTION conveyor_count_enqueued();
