-- Named queries of conveyor.platform.scheduling.nudges: nudges and the task activity they check.

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
