-- Bloat on the job tables (issue 23): autovacuum that takes the hot tables
-- as soon as it comes round, at full speed, whatever the size of the
-- history they keep. Measured by bench/pg_bloat.py (docs/bench.md, "Bloat
-- with a held transaction"). Storage parameters only: no rewrite, a SHARE
-- UPDATE EXCLUSIVE lock for a moment.
--
-- A job's row is written four times: the enqueue's insert, the claim
-- (status pending -> in_progress), the start (attempt, started_delivery,
-- started_at) and the outcome (status -> done/failed/cancelled). The claim
-- and the outcome change `status`, which every partial index's predicate
-- reads, so they are never HOT. The start changes no indexed column (nor a
-- predicate's), so it is HOT when its page has room: measured, 0.96 of
-- starts were, on pages packed full. Its attempt row (conveyor_job_attempts)
-- is one insert when its start and end reach the history in one batch
-- (nearly always); else inserted at the start and completed by the end,
-- whose columns are not indexed: HOT for 0.98 of them.
--
-- fillfactor stays 100 on both. Room kept free on each page does not make a
-- single version fewer, and behind a held snapshot every version stays:
-- with fillfactor 70 on conveyor_jobs the start was HOT for every job
-- (1.00), and the job tables peaked at 30.5 MB against 24.2 MB at 100, since
-- the finished rows kept as history then fill pages to 70 % only.
--
-- Autovacuum by count, not by share of the table: the table keeps history
-- (CONVEYOR_RETENTION), and the 0.02 of migration 0010 is 200,000 dead
-- versions on a table holding 10 million finished rows, ten minutes of
-- work at 100 jobs/s, while the hot tail is a few thousand rows. Here: a
-- pass once 1,000 dead versions (about 3 s of work at 100 jobs/s, three per
-- job) plus 0.5 % of the rows have accumulated, unthrottled (cost_delay 0):
-- the pages it must visit are the hot tail's, and a throttled pass after a
-- held snapshot is let go leaves dead versions behind for longer. An
-- insert-driven pass (autovacuum_vacuum_insert_*, Postgres 13 and later,
-- as gen_random_uuid in 0066 already needs) too, so history pages are
-- marked all-visible and frozen in small steps, and later passes skip them. How soon a pass
-- comes round is the server's autovacuum_naptime (default 60 s): no table
-- setting shortens it (docs/bench.md).
ALTER TABLE conveyor_jobs SET (
    autovacuum_vacuum_threshold = 1000,
    autovacuum_vacuum_scale_factor = 0.005,
    autovacuum_vacuum_insert_threshold = 5000,
    autovacuum_vacuum_insert_scale_factor = 0.05,
    autovacuum_vacuum_cost_delay = 0
);

ALTER TABLE conveyor_job_attempts SET (
    autovacuum_vacuum_threshold = 1000,
    autovacuum_vacuum_scale_factor = 0.005,
    autovacuum_vacuum_insert_threshold = 5000,
    autovacuum_vacuum_insert_scale_factor = 0.05,
    autovacuum_vacuum_cost_delay = 0
);
