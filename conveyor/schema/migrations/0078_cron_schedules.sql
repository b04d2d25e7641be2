-- Cron schedules managed at run time in the library (conveyor/scheduling/store/postgres.py):
-- added, paused, resumed and removed through app.cron, `conveyor cron` and /api/admin/cron,
-- fired by every `conveyor scheduler` (and worker) beside the schedules declared in code.
-- The name keys each occurrence's enqueue (cron:<name>:<fire time>), so it is the key here.
-- since: when the row was stored or last resumed (server clock); nothing before it fires.
-- (The agent platform's own schedules are its `schedules` table, a blueprint migration.)
CREATE TABLE IF NOT EXISTS conveyor_cron_schedules (
    name        TEXT PRIMARY KEY,
    cron        TEXT NOT NULL,
    tz          TEXT NOT NULL,
    job         TEXT NOT NULL,
    payload     JSONB NOT NULL,
    paused      BOOLEAN NOT NULL DEFAULT false,
    since       TIMESTAMPTZ NOT NULL,
    updated_at  TIMESTAMPTZ NOT NULL DEFAULT now()
);
