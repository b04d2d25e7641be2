-- Waiting for an event (conveyor/events.py: ctx.wait_for, app.events.signal),
-- on the postgres broker.
--
-- A parked job is a pending row whose available_at is its timeout and whose
-- wait_event names the event it awaits (the state users see: "awaiting").
-- A signal makes the awaiting rows of its name due at once and clears their
-- wait_event, in one statement under the event's advisory lock; the same
-- lock serialises a park with a signal, so a signal is never missed.

ALTER TABLE conveyor_jobs ADD COLUMN IF NOT EXISTS wait_event TEXT;

-- The signal's scan: only parked rows.
CREATE INDEX IF NOT EXISTS conveyor_jobs_awaiting ON conveyor_jobs (wait_event)
    WHERE wait_event IS NOT NULL AND status = 'pending';

-- Signals kept for jobs that start waiting later (CONVEYOR_EVENT_TTL_SECONDS);
-- the first signal's resolution holds until it expires.
CREATE TABLE IF NOT EXISTS conveyor_events (
    name        TEXT PRIMARY KEY CHECK (length(name) BETWEEN 1 AND 200),
    resolution  TEXT NOT NULL,
    expires_at  TIMESTAMPTZ NOT NULL
);

-- Each job's resolution of each wait, insert-first: every later delivery of
-- the job reads the same answer. Gone with the job's row.
CREATE TABLE IF NOT EXISTS conveyor_job_waits (
    job_id       TEXT NOT NULL REFERENCES conveyor_jobs (id) ON DELETE CASCADE,
    name         TEXT NOT NULL,
    resolution   TEXT NOT NULL,
    resolved_at  TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY (job_id, name)
);
