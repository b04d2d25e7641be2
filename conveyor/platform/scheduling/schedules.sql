-- Named queries of conveyor.platform.scheduling.schedules: schedules, their fire history, the clock.

-- name: schedule_insert
INSERT INTO schedules (id, name, cron, timezone, job, payload, misfire_policy, enabled, next_fire_at)
VALUES (%(id)s, %(name)s::text, %(cron)s, %(timezone)s, %(job)s, %(payload)s, %(misfire_policy)s, %(enabled)s,
        %(next_fire_at)s)
RETURNING id, name, cron, timezone, job, payload, misfire_policy, enabled, next_fire_at, last_fire_at, created_at, updated_at

-- name: schedule_get
-- By id or by name (a name never starts with 'sch_', so the two cannot collide).
SELECT id, name, cron, timezone, job, payload, misfire_policy, enabled, next_fire_at, last_fire_at, created_at, updated_at
  FROM schedules WHERE id = %(id)s OR name = %(id)s

-- name: schedule_list
SELECT id, name, cron, timezone, job, payload, misfire_policy, enabled, next_fire_at, last_fire_at, created_at, updated_at
  FROM schedules ORDER BY created_at, id LIMIT %(limit)s OFFSET %(offset)s

-- name: schedule_pause
UPDATE schedules SET enabled = false, updated_at = now()
 WHERE id = %(id)s OR name = %(id)s
RETURNING id, name, cron, timezone, job, payload, misfire_policy, enabled, next_fire_at, last_fire_at, created_at, updated_at

-- name: schedule_resume
-- Occurrences while paused are not fired: the next fire is computed from now.
UPDATE schedules SET enabled = true, next_fire_at = %(next_fire_at)s, updated_at = now()
 WHERE id = %(id)s OR name = %(id)s
RETURNING id, name, cron, timezone, job, payload, misfire_policy, enabled, next_fire_at, last_fire_at, created_at, updated_at

-- name: schedule_delete
DELETE FROM schedules WHERE id = %(id)s OR name = %(id)s RETURNING id

-- name: db_now
SELECT coalesce(%(now)s::timestamptz, now())

-- name: fire_record
INSERT INTO schedule_fires (schedule_id, fire_time, status, job_id, reason)
VALUES (%(id)s, %(fire_time)s, %(status)s, %(job_id)s::text, %(reason)s::text)
ON CONFLICT (schedule_id, fire_time) DO NOTHING

-- name: fire_list
SELECT fire_time, status, job_id, reason, fired_at FROM schedule_fires
 WHERE schedule_id = %(id)s ORDER BY fire_time
