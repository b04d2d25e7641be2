-- Named queries of conveyor.tasks.steps: the once-guard's records (migration 0015_job_steps.sql).

-- name: once
-- Insert first: a row when this call recorded the step, none when a delivery of the
-- job recorded it before (committed), or waits for one that holds it uncommitted.
INSERT INTO conveyor_job_steps (job_id, step, delivery)
VALUES (%(job_id)s, %(step)s, %(delivery)s)
ON CONFLICT DO NOTHING
RETURNING 1

-- name: prune
-- Steps recorded longer ago than the retention, a batch at a time (brokers whose
-- jobs are not rows in this database; the postgres broker prunes steps with their job).
DELETE FROM conveyor_job_steps WHERE (job_id, step) IN (
    SELECT job_id, step FROM conveyor_job_steps
    WHERE done_at < now() - make_interval(secs => %(retention)s)
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
)
