-- Stored job results (conveyor/results/postgres.py): one row per job whose
-- type has store_result=True, kept until expires_at (CONVEYOR_RESULT_TTL).
-- ok = false is a marker that the job failed for good: it only wakes readers;
-- the job's state and error are the broker's.
CREATE TABLE conveyor_results (
    job_id      TEXT PRIMARY KEY,
    job         TEXT NOT NULL,
    ok          BOOLEAN NOT NULL,
    value       JSON,
    stored_at   TIMESTAMPTZ NOT NULL DEFAULT now(),
    expires_at  TIMESTAMPTZ NOT NULL,
    CHECK (ok = (value IS NOT NULL))
);

CREATE INDEX conveyor_results_expires ON conveyor_results (expires_at);
