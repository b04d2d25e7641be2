-- Named queries of conveyor.platform.scheduling: schedules, pauses, nudges.

-- name: schedule_insert
INSERT INTO schedules (id, name, cron, timezone, job, payload, misfire_policy, enabled, next_fire_at)
VALUES (%(id)s, %(name)s::text, %(cron)s, %(timezone)s, %(job)s, %(payload)s, %(misfire_policy)s, %(enabled)s,
        %(next_fire_at)s)
RETURNING *

-- name: schedule_get
SELECT * FROM schedules WHERE id = %(id)s OR name = %(id)s

-- name: schedule_list
SELECT * FROM schedules ORDER BY created_at, id LIMIT %(limit)s OFFSET %(offset)s

-- name: schedule_pause
UPDATE schedules SET enabled = false, updated_at = now() WHERE id = %(id)s OR name = %(id)s RETURNING *

-- name: schedule_resume
-- Occurrences while paused are not fired: the next fire is computed from now.
UPDATE schedules SET enabled = true, next_fire_at = %(next_fire_at)s, updated_at = now()
 WHERE id = %(id)s OR name = %(id)s
RETURNING *

-- name: schedule_delete
DELETE FROM schedules WHERE id = %(id)s OR name = %(id)s RETURNING id

-- name: db_now
SELECT coalesce(%(now)s::timestamptz, now())

-- name: schedule_claim_due
-- Rows another scheduler holds are skipped: it is firing them right now.
SELECT id, cron, timezone, misfire_policy, next_fire_at
  FROM schedules
 WHERE enabled AND next_fire_at <= %(now)s
 ORDER BY next_fire_at
 LIMIT %(limit)s
   FOR UPDATE SKIP LOCKED

-- name: schedule_advance
UPDATE schedules
   SET next_fire_at = %(next_fire_at)s, last_fire_at = coalesce(%(last_fire_at)s::timestamptz, last_fire_at),
       updated_at = now()
 WHERE id = %(id)s

-- name: fire_record
INSERT INTO schedule_fires (schedule_id, fire_time, status, job_id, reason)
VALUES (%(id)s, %(fire_time)s, %(status)s, %(job_id)s::text, %(reason)s::text)
ON CONFLICT (schedule_id, fire_time) DO NOTHING

-- name: fire_list
SELECT fire_time, status, job_id, reason, fired_at FROM schedule_fires
 WHERE schedule_id = %(id)s ORDER BY fire_time

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

-- name: activity_reply
INSERT INTO task_activity (task_id, last_user_reply_at) VALUES (%(task_id)s, coalesce(%(at)s::timestamptz, now()))
ON CONFLICT (task_id) DO UPDATE
    SET last_user_reply_at = greatest(task_activity.last_user_reply_at, EXCLUDED.last_user_reply_at),
        updated_at = now()

-- name: activity_close
INSERT INTO task_activity (task_id, closed_at) VALUES (%(task_id)s, coalesce(%(at)s::timestamptz, now()))
ON CONFLICT (task_id) DO UPDATE
    SET closed_at = coalesce(task_activity.closed_at, EXCLUDED.closed_at), updated_at = now()

-- name: nudge_insert
INSERT INTO nudges (id, task_id, key, fire_at, job, payload)
VALUES (%(id)s, %(task_id)s, %(key)s, %(fire_at)s, %(job)s, %(payload)s)
ON CONFLICT (key) DO NOTHING
RETURNING id

-- name: nudge_by_key
SELECT id, job_id FROM nudges WHERE key = %(key)s

-- name: nudge_set_job
UPDATE nudges SET job_id = %(job_id)s WHERE id = %(id)s

-- name: nudge_lock
-- The task's state, read by id: has the user replied since the nudge was
-- set (a user message in the platform's messages, or a reply noted in
-- task_activity), or was the task closed?
SELECT n.task_id, n.status, n.fire_at, n.job, n.payload,
       a.closed_at IS NOT NULL AS task_closed,
       coalesce(a.last_user_reply_at > n.created_at, false)
         OR EXISTS (SELECT 1 FROM messages m
                     WHERE m.task_id = n.task_id AND m.role = 'user' AND m.created_at > n.created_at)
         AS user_replied
  FROM nudges n LEFT JOIN task_activity a ON a.task_id = n.task_id
 WHERE n.id = %(id)s
   FOR UPDATE OF n

-- name: nudge_sent
UPDATE nudges SET status = 'sent', sent_job_id = %(job_id)s, resolved_at = now() WHERE id = %(id)s

-- name: nudge_skipped
UPDATE nudges SET status = 'skipped', skip_reason = %(reason)s, resolved_at = now() WHERE id = %(id)s

-- name: nudge_cancel
UPDATE nudges SET status = 'cancelled', resolved_at = now() WHERE id = %(id)s AND status = 'scheduled'
RETURNING id

-- name: nudge_get
SELECT id, task_id, key, fire_at, job, status, skip_reason, job_id, sent_job_id, created_at, resolved_at
  FROM nudges WHERE id = %(id)s
