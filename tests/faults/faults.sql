-- The fault suite's own tables, created in each fault test's database.

-- The run log: one row per run of a fault job, never updated in place
-- except to add how it ended. Unlike the ledger it is NOT idempotent, so it
-- shows every run, including a second run of the same delivery or two runs
-- at once. Times are the database server's clock (start) plus the run's own
-- elapsed time (end), so a worker whose clock is off still logs true times.
CREATE TABLE fault_runs (
    run_id      UUID PRIMARY KEY,
    job_id      TEXT NOT NULL,
    token       TEXT NOT NULL,
    attempt     INT NOT NULL,
    delivery    BIGINT,
    host        TEXT NOT NULL,
    pid         INT NOT NULL,
    started_at  TIMESTAMPTZ NOT NULL DEFAULT clock_timestamp(),
    effect_at   TIMESTAMPTZ,
    ended_at    TIMESTAMPTZ,
    ok          BOOLEAN,
    -- The run writes its effect through a fence (ctx.once / completion in its transaction).
    fenced      BOOLEAN NOT NULL DEFAULT false,
    -- The host's boot clock (/proc/uptime) before the insert and at the end: every worker of the
    -- campaign runs on one kernel, and no libfaketime nor server clock step moves this clock.
    started_up  DOUBLE PRECISION,
    ended_up    DOUBLE PRECISION,
    -- The run's delivery was still its job's current one when its body's work was done (checked by
    -- the body itself, the campaign's grouped jobs only): it held its group slot from start to end,
    -- as a delivery taken back never becomes current again. NULL: not checked, or no answer.
    held        BOOLEAN
);
CREATE INDEX fault_runs_job ON fault_runs (job_id);

-- One row per run of a final-failure hook (non-idempotent too: a hook that
-- runs twice leaves two rows).
CREATE TABLE fault_dead (
    id      BIGSERIAL PRIMARY KEY,
    job_id  TEXT NOT NULL,
    token   TEXT,
    error   TEXT NOT NULL,
    pid     INT NOT NULL,
    at      TIMESTAMPTZ NOT NULL DEFAULT clock_timestamp(),
    -- Set when the hook reached its end (a hook killed midway leaves NULL).
    ended_at TIMESTAMPTZ
);

-- One row per run of a cancel hook (``on_cancel``), non-idempotent: a hook that runs twice
-- for one job leaves two rows.
CREATE TABLE fault_cancels (
    id      BIGSERIAL PRIMARY KEY,
    job_id  TEXT NOT NULL,
    token   TEXT,
    pid     INT NOT NULL,
    at      TIMESTAMPTZ NOT NULL DEFAULT clock_timestamp()
);

-- The campaign's effect log: one row per applied effect of a job body, never
-- deduplicated. A fenced effect commits only while its delivery is current
-- (or once per job), so a stale delivery's fenced effect leaves no row.
CREATE TABLE fault_effects (
    id          BIGSERIAL PRIMARY KEY,
    run_id      UUID NOT NULL,
    job_id      TEXT NOT NULL,
    token       TEXT NOT NULL,
    delivery    BIGINT,
    fenced      BOOLEAN NOT NULL,
    at          TIMESTAMPTZ NOT NULL DEFAULT clock_timestamp()
);

-- The campaign's time-limits kind: what each hammering job did to its worker's pool (what =
-- 'hammer': got = checkouts, landed = time limits it met), and each census after (got = the
-- connections the pool could still hand out, size = its max_size).
CREATE TABLE fault_pools (
    id      BIGSERIAL PRIMARY KEY,
    pid     INT NOT NULL,
    what    TEXT NOT NULL,
    got     INT NOT NULL,
    size    INT NOT NULL,
    landed  INT NOT NULL,
    -- A census's pool at its end, while it held what it got (JSON: psycopg_pool's get_stats() and whether
    -- the pool was still opening a connection): a leak is connections the pool counts that nobody holds.
    stats   TEXT,
    at      TIMESTAMPTZ NOT NULL DEFAULT clock_timestamp()
);

-- The campaign's waiters (ctx.wait_for): one row per run that got past its wait, with what the wait
-- returned (JSON: the signal's data, null after the timeout). Non-idempotent: a job resumed twice, or
-- whose post-wait part ran again, leaves two rows.
CREATE TABLE fault_waits (
    id          BIGSERIAL PRIMARY KEY,
    run_id      UUID NOT NULL,
    job_id      TEXT NOT NULL,
    token       TEXT NOT NULL,
    delivery    BIGINT,
    data        TEXT NOT NULL,
    at          TIMESTAMPTZ NOT NULL DEFAULT clock_timestamp()
);
