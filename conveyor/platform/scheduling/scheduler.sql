-- Named queries of conveyor.platform.scheduling.scheduler: claiming due schedules and moving them on.

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
