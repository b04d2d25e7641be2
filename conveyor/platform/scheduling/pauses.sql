-- Named queries of conveyor.platform.scheduling.pauses: run pauses and their resumption.

-- name: pause_insert
INSERT INTO run_pauses (id, run_id, task_id, reason, resume_at, resume_job, resume_payload)
VALUES (%(id)s, %(run_id)s, %(task_id)s::text, %(reason)s, %(resume_at)s, %(resume_job)s, %(resume_payload)s)

-- name: pause_set_job
UPDATE run_pauses SET job_id = %(job_id)s WHERE id = %(id)s

-- name: pause_lock
-- The pause, and its run's status when the run is one of the platform's.
SELECT p.run_id, p.status, p.resume_job, p.resume_payload, p.resume_at, r.status
  FROM run_pauses p LEFT JOIN runs r ON r.id = p.run_id
 WHERE p.id = %(id)s
   FOR UPDATE OF p

-- name: pause_cancel
UPDATE run_pauses SET status = 'cancelled', resolved_at = now() WHERE id = %(id)s

-- name: pause_resumed
UPDATE run_pauses SET status = 'resumed', resumed_job_id = %(job_id)s, resolved_at = now() WHERE id = %(id)s

-- name: pause_cancel_run
UPDATE run_pauses SET status = 'cancelled', resolved_at = now()
 WHERE run_id = %(run_id)s AND status = 'waiting'
RETURNING id

-- name: pause_get
SELECT id, run_id, task_id, status, reason, resume_at, resume_job, job_id, resumed_job_id, created_at, resolved_at
  FROM run_pauses WHERE id = %(id)s
