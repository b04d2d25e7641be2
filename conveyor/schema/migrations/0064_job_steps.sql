-- Once-guarded steps of jobs (conveyor/tasks/steps.py, ctx.once): one row per
-- (job, step) whose effect committed. A step's effect and its row commit in the
-- same transaction of the job's own code; the primary key makes a second row for
-- the same step impossible, so whichever delivery of the job commits first applies
-- the effect and every other delivery skips it.
--
--   delivery  the delivery that applied the step (what the fault campaign checks)
--   done_at   when, on the server's clock; rows are pruned with their job (the
--             postgres broker's prune), or after the retention (other brokers)

CREATE TABLE conveyor_job_steps (
    job_id    TEXT NOT NULL,
    step      TEXT NOT NULL CHECK (length(step) BETWEEN 1 AND 200),
    delivery  INTEGER,
    done_at   TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY (job_id, step)
);

-- Pruning by age, a batch at a time. BRIN: rows arrive in done_at order, and a
-- BRIN entry costs the once-guard's insert next to nothing (a btree would be a
-- second index write on every step).
CREATE INDEX conveyor_job_steps_done_at ON conveyor_job_steps USING brin (done_at);
