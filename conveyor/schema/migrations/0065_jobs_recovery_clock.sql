-- The Postgres broker's recovery guard against server clock steps
-- (conveyor/brokers/postgres/recovery.py). A recovery pass that finds the
-- server's clock moved more or less than its own monotonic clock since its
-- previous pass (the clock was stepped) sets resumes_at a lease ahead: until
-- then no pass declares anyone dead, since every live worker's heartbeat was
-- stamped on the old clock. One row, shared by every worker process.
CREATE TABLE IF NOT EXISTS conveyor_recovery_clock (
    id          INTEGER PRIMARY KEY CHECK (id = 1),
    resumes_at  TIMESTAMPTZ NOT NULL
);
