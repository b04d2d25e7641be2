-- Fair shares per tenant group on the postgres broker (issue 21.2).
--
-- A job may name a group (app.jobs.enqueue(..., group="user:42")); jobs
-- without one are the default group ''. Within a queue that has named
-- groups, the claim serves groups round-robin (least recently served
-- first), so one tenant's backlog does not hold the others back; within a
-- group the queue's order holds (its rank: priority with aging, 0074).
-- A constant default: no table rewrite. The check is NOT VALID so adding it
-- does not scan a big table under its lock (every existing row is '' anyway);
-- it holds for every row written from now on.
ALTER TABLE conveyor_jobs ADD COLUMN IF NOT EXISTS job_group TEXT NOT NULL DEFAULT '';
DO $$ BEGIN
    ALTER TABLE conveyor_jobs ADD CONSTRAINT conveyor_jobs_group_length CHECK (length(job_group) <= 128) NOT VALID;
EXCEPTION WHEN duplicate_object THEN NULL;
END $$;

-- The grouped claim's scan: one group's waiting rows in claim order.
CREATE INDEX IF NOT EXISTS conveyor_jobs_group_pending
    ON conveyor_jobs (queue, job_group, rank_at, priority DESC) WHERE status = 'pending';

-- A group's running count under its cap (CONVEYOR_QUEUES__<Q>__GROUP_CONCURRENCY):
-- the held rows of one named group.
CREATE INDEX IF NOT EXISTS conveyor_jobs_group_held
    ON conveyor_jobs (queue, job_group) WHERE status = 'in_progress' AND job_group <> '';

-- The groups of a queue that ever had a named group, with when each was
-- last served. A row is the lock two claimers take (SKIP LOCKED) before
-- they count a group's held jobs against its cap, so they cannot both take
-- its last slot. The running count itself is the held rows (above): every
-- fenced state change that ends a hold (ack, nack, retry, hand-back,
-- recovery, cancel) releases its slot by the row's own status, once.
CREATE TABLE IF NOT EXISTS conveyor_job_groups (
    queue        TEXT NOT NULL,
    job_group    TEXT NOT NULL,
    last_served  TIMESTAMPTZ NOT NULL DEFAULT '-infinity',
    PRIMARY KEY (queue, job_group)
);
CREATE INDEX IF NOT EXISTS conveyor_job_groups_rotation ON conveyor_job_groups (queue, last_served);
