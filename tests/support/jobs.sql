-- Tables the test job types write to; created in the template database.
CREATE TABLE probe_runs (
    id          BIGSERIAL PRIMARY KEY,
    token       TEXT NOT NULL,
    job_id      TEXT NOT NULL,
    attempt     INT NOT NULL,
    pid         INT NOT NULL,
    started_at  TIMESTAMPTZ NOT NULL DEFAULT clock_timestamp(),
    finished_at TIMESTAMPTZ
);
CREATE TABLE probe_dead (
    job_id  TEXT NOT NULL,
    token   TEXT,
    error   TEXT NOT NULL
);
-- What test.effect did, one row per step of each of its deliveries (tests/integration/test_effects.py).
CREATE TABLE effect_log (
    id        BIGSERIAL PRIMARY KEY,
    token     TEXT NOT NULL,
    job_id    TEXT NOT NULL,
    delivery  INT,
    attempt   INT NOT NULL,
    pid       INT NOT NULL,
    kind      TEXT NOT NULL,
    at        TIMESTAMPTZ NOT NULL DEFAULT clock_timestamp()
);
-- What test.grouped did (tests/acceptance/test_pg_groups.py): each group's jobs
-- running now and the most ever running at once, and when each job finished.
CREATE TABLE group_load (
    grp      TEXT PRIMARY KEY,
    running  INT NOT NULL DEFAULT 0,
    peak     INT NOT NULL DEFAULT 0
);
CREATE TABLE group_done (
    job_id  TEXT PRIMARY KEY,
    grp     TEXT NOT NULL,
    seq     BIGSERIAL
);
