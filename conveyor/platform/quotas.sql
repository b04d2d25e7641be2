-- Per-user quotas (conveyor.platform.quotas; tables: runs, tasks, messages, stream_leases of 0063).

-- name: lock_user
-- Serialises this user's quota checks until the transaction ends, so two requests cannot both
-- take the last place. One lock per user and purpose.
SELECT pg_advisory_xact_lock(hashtextextended(%(purpose)s || ':' || %(user_id)s, 0))

-- name: run_usage
-- The user's runs queued or running, and the bytes of streamed text of their runs that ended
-- within the stream retention (a run's stream is its reply's text, chunk by chunk).
SELECT
    (SELECT count(*) FROM runs r JOIN tasks t ON t.id = r.task_id
      WHERE t.user_id = %(user_id)s AND r.status IN ('queued', 'running')),
    (SELECT coalesce(sum(octet_length(m.content)), 0)
       FROM runs r JOIN tasks t ON t.id = r.task_id JOIN messages m ON m.id = r.assistant_message_id
      WHERE t.user_id = %(user_id)s AND r.finished_at > now() - make_interval(secs => %(retention)s))

-- name: prune_stream_leases
-- Leases that ran out: their API process died (or lost the database) while the stream was open.
DELETE FROM stream_leases WHERE user_id = %(user_id)s AND expires_at <= now()

-- name: count_stream_leases
SELECT count(*) FROM stream_leases WHERE user_id = %(user_id)s

-- name: open_stream_lease
INSERT INTO stream_leases (id, user_id, run_id, expires_at)
VALUES (%(id)s, %(user_id)s, %(run_id)s, now() + make_interval(secs => %(lease)s))

-- name: renew_stream_lease
-- No row when the lease ran out and was taken back: the stream then holds no place any more.
UPDATE stream_leases SET expires_at = now() + make_interval(secs => %(lease)s)
WHERE id = %(id)s AND expires_at > now()
RETURNING id

-- name: close_stream_lease
DELETE FROM stream_leases WHERE id = %(id)s
