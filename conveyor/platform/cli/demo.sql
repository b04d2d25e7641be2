-- What `conveyor demo` counts and checks; every query is scoped to one demo's user.

-- name: runs
SELECT r.id, r.status, r.attempts, r.assistant_message_id, r.finalized_at IS NOT NULL
FROM runs r JOIN tasks t ON t.id = r.task_id
WHERE t.user_id = %(user_id)s

-- name: reply
SELECT content FROM messages WHERE id = %(id)s

-- name: charges
SELECT count(*) FROM credit_entries WHERE user_id = %(user_id)s AND kind = 'consume'

-- name: extractions
SELECT count(*), coalesce(sum(memories), 0) FROM memory_extractions WHERE user_id = %(user_id)s

-- name: memories
SELECT count(*) FROM memories WHERE user_id = %(user_id)s

-- name: indexed
SELECT count(*) FILTER (WHERE r.indexed_version = r.version),
       (SELECT count(*) FROM resource_chunks c WHERE c.user_id = %(user_id)s)
FROM resources r WHERE r.user_id = %(user_id)s
