-- Users and API keys (conveyor/access.py); the tables are migration 0050_access.sql.

-- name: create_user
INSERT INTO users (id) VALUES (%(id)s) ON CONFLICT (id) DO NOTHING RETURNING id

-- name: get_user
SELECT id, created_at FROM users WHERE id = %(id)s

-- name: create_api_key
INSERT INTO api_keys (id, user_id, digest) VALUES (%(id)s, %(user_id)s, %(digest)s)

-- name: revoke_api_key
-- Revoking twice keeps the first time; no row when there is no such key.
UPDATE api_keys SET revoked_at = coalesce(revoked_at, now()) WHERE id = %(id)s RETURNING user_id

-- name: list_api_keys
SELECT id, user_id, created_at, revoked_at FROM api_keys WHERE user_id = %(user_id)s ORDER BY created_at, id

-- name: api_key_digest
-- A live key of an existing user, by its public id: the caller compares the digest.
SELECT k.user_id, k.digest FROM api_keys k JOIN users u ON u.id = k.user_id
WHERE k.id = %(id)s AND k.revoked_at IS NULL
