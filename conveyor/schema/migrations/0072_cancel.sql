-- Cancel (issue 21 item 1): a job can end `cancelled`, a terminal status
-- beside done and failed, and a cancellation asked of a job a worker holds is
-- stored on its row (cancel_requested_at), so it holds across worker restarts
-- and for a job no worker has started yet: the holder learns of it by
-- NOTIFY conveyor_cancel (payload: the job id) and ends the job with a fenced
-- write; a later claim's start ends it at once (jobs.sql, start).

ALTER TABLE conveyor_jobs ADD COLUMN cancel_requested_at TIMESTAMPTZ;

ALTER TABLE conveyor_jobs DROP CONSTRAINT conveyor_jobs_status_check;
ALTER TABLE conveyor_jobs ADD CONSTRAINT conveyor_jobs_status_check
    CHECK (status IN ('pending', 'in_progress', 'done', 'failed', 'cancelled'));

ALTER TABLE conveyor_jobs DROP CONSTRAINT conveyor_jobs_finished;
ALTER TABLE conveyor_jobs ADD CONSTRAINT conveyor_jobs_finished
    CHECK ((status IN ('done', 'failed', 'cancelled')) = (completed_at IS NOT NULL));

-- A cancelled row is history like a done or failed one (listing, pruning).
DROP INDEX conveyor_jobs_history;
CREATE INDEX conveyor_jobs_history ON conveyor_jobs (queue, status, completed_at)
    WHERE status IN ('done', 'failed', 'cancelled');
