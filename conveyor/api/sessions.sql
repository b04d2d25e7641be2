-- The dashboard's sessions and its sign-in throttle (migration 0050_access.sql).
-- Every time is the database's clock, one for every API process.

-- name: create_session
INSERT INTO admin_sessions (digest, token_epoch, client, expires_at)
VALUES (%(digest)s, %(epoch)s, %(client)s, now() + make_interval(secs => %(seconds)s))

-- name: live_session
SELECT 1 FROM admin_sessions
WHERE digest = %(digest)s AND token_epoch = %(epoch)s AND revoked_at IS NULL AND expires_at > now()

-- name: revoke_session
UPDATE admin_sessions SET revoked_at = coalesce(revoked_at, now()) WHERE digest = %(digest)s

-- name: prune_sessions
DELETE FROM admin_sessions WHERE expires_at < now() - interval '1 day'

-- name: recent_failures
SELECT count(*) FROM admin_login_failures
WHERE client = %(client)s AND failed_at > clock_timestamp() - make_interval(secs => %(window)s)

-- name: record_failure
INSERT INTO admin_login_failures (client) VALUES (%(client)s)

-- name: prune_failures
DELETE FROM admin_login_failures WHERE failed_at < clock_timestamp() - make_interval(secs => %(window)s)
