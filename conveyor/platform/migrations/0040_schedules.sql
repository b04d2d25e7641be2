-- Cron schedules. Any number of schedulers claim due rows with
-- FOR UPDATE SKIP LOCKED and enqueue schedule.fire with the key
-- schedule:{id}:{fire time}, so each occurrence fires once.

CREATE TABLE schedules (
    id              TEXT PRIMARY KEY,
    name            TEXT UNIQUE,
    cron            TEXT NOT NULL,
    timezone        TEXT NOT NULL DEFAULT 'UTC',
    job             TEXT NOT NULL,
    payload         JSONB NOT NULL DEFAULT '{}'::jsonb,
    -- What a scheduler does with occurrences missed while none ran:
    -- once (fire the latest one), skip (fire none), all (fire each).
    misfire_policy  TEXT NOT NULL DEFAULT 'once' CHECK (misfire_policy IN ('once', 'skip', 'all')),
    enabled         BOOLEAN NOT NULL DEFAULT true,
    next_fire_at    TIMESTAMPTZ NOT NULL,
    last_fire_at    TIMESTAMPTZ,
    created_at      TIMESTAMPTZ NOT NULL DEFAULT now(),
    updated_at      TIMESTAMPTZ NOT NULL DEFAULT now()
);

-- Only enabled rows are ever scanned for due fires.
CREATE INDEX schedules_due ON schedules (next_fire_at) WHERE enabled;

-- What schedule.fire did with each occurrence: one row per occurrence.
CREATE TABLE schedule_fires (
    schedule_id  TEXT NOT NULL REFERENCES schedules (id) ON DELETE CASCADE,
    fire_time    TIMESTAMPTZ NOT NULL,
    status       TEXT NOT NULL CHECK (status IN ('enqueued', 'skipped')),
    job_id       TEXT,
    reason       TEXT,
    fired_at     TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY (schedule_id, fire_time)
);
