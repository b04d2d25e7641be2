-- Weighted fair shares per group on the postgres broker (issue 21.2).
--
-- A named group's weight (1 by default) is how many turns it gets per round:
-- with weights 3:2:1 and backlogs in all three, claims come out 3:2:1. The
-- grouped claim is stride scheduling in virtual time (start-time fair queuing):
--   pass    the group's virtual finish time: each job claimed of it adds
--           1/weight (claim_groups), so a heavier group advances slower and
--           is picked more often; the claim takes the lowest pass first.
--   vstart  the virtual time its last claim started at. The queue's virtual
--           time is its groups' highest vstart: a group that was idle (or
--           new, pass 0) starts at that, not at its old pass, so an idle
--           spell banks no credit for a burst later.
--   weight  set by app.jobs.set_group_weight (the admin API, `conveyor queues
--           weight`); a weight in the queue's settings (group_weights) is
--           passed with each claim and wins over this one. A row whose weight
--           is not 1 is not pruned (lock_idle_groups): the weight is kept.
-- Constant defaults: no table rewrite.
ALTER TABLE conveyor_job_groups
    ADD COLUMN IF NOT EXISTS weight INT NOT NULL DEFAULT 1,
    ADD COLUMN IF NOT EXISTS pass FLOAT8 NOT NULL DEFAULT 0,
    ADD COLUMN IF NOT EXISTS vstart FLOAT8 NOT NULL DEFAULT 0;
DO $$ BEGIN
    ALTER TABLE conveyor_job_groups ADD CONSTRAINT conveyor_job_groups_weight CHECK (weight BETWEEN 1 AND 1000);
EXCEPTION WHEN duplicate_object THEN NULL;
END $$;

-- The rotation is by pass now (lock_groups, pick_groups), and the queue's
-- virtual time is one backward probe of its highest vstart.
CREATE INDEX IF NOT EXISTS conveyor_job_groups_pass ON conveyor_job_groups (queue, pass);
CREATE INDEX IF NOT EXISTS conveyor_job_groups_vstart ON conveyor_job_groups (queue, vstart);
-- Nothing orders groups by last_served any more (the prune filters on it across queues).
DROP INDEX IF EXISTS conveyor_job_groups_rotation;
