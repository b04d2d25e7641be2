-- Per-job priority (0..9, higher runs first) with aging against starvation.
--
-- `priority` used to hold Dramatiq's actor option (lower first); conveyor
-- always wrote 0 there. From now on it holds the job's own priority as the
-- enqueue gave it (0..9, higher first); Dramatiq's actor option is not used
-- to order claims (README, "Priorities").
--
-- A pending row's claim order is its rank: the time it became available
-- minus its lead (priority x CONVEYOR_PRIORITY_AGING_SECONDS at enqueue).
-- Claims take the lowest rank first, so a job overtakes lower-priority ones
-- that became available at most its lead earlier, never more. The trigger
-- keeps the rank in step with every statement that moves available_at
-- (enqueue, retry, park, signal, promote, retry_failed): none of them has
-- to know about it.
--
-- The upgrade touches only the rows still to run: a table that keeps
-- millions of finished rows is not rewritten under its lock. A finished row
-- has no rank until its available_at moves (an operator's retry), which the
-- trigger ranks; every other way back to `pending` starts from a row ranked
-- here (`in_progress`). The checks are NOT VALID for the same reason (the
-- rows they would scan were written with priority 0 and no lead); they hold
-- for every row written from now on.
ALTER TABLE conveyor_jobs
    ADD COLUMN rank_lead DOUBLE PRECISION NOT NULL DEFAULT 0,
    ADD COLUMN rank_at TIMESTAMPTZ;

UPDATE conveyor_jobs SET priority = 0, rank_at = available_at WHERE status IN ('pending', 'in_progress');
ALTER TABLE conveyor_jobs ADD CONSTRAINT conveyor_jobs_rank_lead CHECK (rank_lead >= 0) NOT VALID;
ALTER TABLE conveyor_jobs ADD CONSTRAINT conveyor_jobs_priority_range CHECK (priority BETWEEN 0 AND 9) NOT VALID;

CREATE FUNCTION conveyor_jobs_rank() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    NEW.rank_at := NEW.available_at - make_interval(secs => NEW.rank_lead);
    RETURN NEW;
END
$$;

CREATE TRIGGER conveyor_jobs_rank BEFORE INSERT OR UPDATE OF available_at, rank_lead ON conveyor_jobs
    FOR EACH ROW EXECUTE FUNCTION conveyor_jobs_rank();

-- The claim's scan, in claim order (rank, then the higher priority on a tie).
DROP INDEX conveyor_jobs_pending;
CREATE INDEX conveyor_jobs_ready ON conveyor_jobs (queue, rank_at, priority DESC)
    WHERE status = 'pending';
