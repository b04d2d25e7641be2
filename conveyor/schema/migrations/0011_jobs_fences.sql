-- The Postgres broker (conveyor/brokers/postgres/): make a delivery's start
-- and its final-failure claim safe to repeat. A worker repeats them when
-- the first call's reply was lost (a connection reset after COMMIT): the
-- repeat must neither count the attempt twice nor, having found the claim
-- already made, skip the final-failure hook.
--
--   started_delivery        the delivery whose start counted the current attempt
--   final_failure_delivery  the delivery that claimed the final failure

ALTER TABLE conveyor_jobs ADD COLUMN started_delivery INTEGER;
ALTER TABLE conveyor_jobs ADD COLUMN final_failure_delivery INTEGER;
