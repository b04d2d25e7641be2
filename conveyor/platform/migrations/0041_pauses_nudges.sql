-- wait_and_resume and nudges: delayed jobs whose processors check the
-- current state of these rows by id before they act.

-- A run paused by a tool, resumed by the wait_and_resume job unless the
-- run was cancelled first. At most one waiting pause per run.
CREATE TABLE run_pauses (
    id              TEXT PRIMARY KEY,
    run_id          TEXT NOT NULL,
    task_id         TEXT,
    status          TEXT NOT NULL DEFAULT 'waiting' CHECK (status IN ('waiting', 'resumed', 'cancelled')),
    reason          TEXT NOT NULL DEFAULT '',
    resume_at       TIMESTAMPTZ NOT NULL,
    resume_job      TEXT NOT NULL,
    resume_payload  JSONB NOT NULL,
    job_id          TEXT,
    resumed_job_id  TEXT,
    created_at      TIMESTAMPTZ NOT NULL DEFAULT now(),
    resolved_at     TIMESTAMPTZ
);

CREATE UNIQUE INDEX run_pauses_one_waiting ON run_pauses (run_id) WHERE status = 'waiting';

-- What a nudge needs to know about its task. Until the agent platform's
-- tasks and messages tables answer it, producers record replies and
-- closures here (see conveyor.platform.scheduling.nudges).
CREATE TABLE task_activity (
    task_id             TEXT PRIMARY KEY,
    last_user_reply_at  TIMESTAMPTZ,
    closed_at           TIMESTAMPTZ,
    updated_at          TIMESTAMPTZ NOT NULL DEFAULT now()
);

CREATE TABLE nudges (
    id           TEXT PRIMARY KEY,
    task_id      TEXT NOT NULL,
    -- The caller's idempotency key: scheduling the same nudge twice is a no-op.
    key          TEXT NOT NULL UNIQUE,
    fire_at      TIMESTAMPTZ NOT NULL,
    job          TEXT NOT NULL,
    payload      JSONB NOT NULL,
    status       TEXT NOT NULL DEFAULT 'scheduled' CHECK (status IN ('scheduled', 'sent', 'skipped', 'cancelled')),
    skip_reason  TEXT CHECK (skip_reason IN ('user_replied', 'task_closed')),
    job_id       TEXT,
    sent_job_id  TEXT,
    created_at   TIMESTAMPTZ NOT NULL DEFAULT now(),
    resolved_at  TIMESTAMPTZ,
    CONSTRAINT nudges_reason_iff_skipped CHECK ((status = 'skipped') = (skip_reason IS NOT NULL))
);

CREATE INDEX nudges_scheduled_by_task ON nudges (task_id) WHERE status = 'scheduled';
