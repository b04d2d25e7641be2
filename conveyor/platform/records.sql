-- The agent platform's records (migration 0030_platform.sql). Every row by its ID.

-- name: create_task
INSERT INTO tasks (id, user_id, kind, title, instructions)
VALUES (%(id)s, %(user_id)s, %(kind)s, %(title)s, %(instructions)s)
ON CONFLICT (id) DO NOTHING
RETURNING id

-- name: get_task
SELECT id, user_id, kind, title, instructions, created_at FROM tasks WHERE id = %(id)s

-- name: add_message
-- A message id already taken adds nothing (no row): the caller compares.
INSERT INTO messages (id, task_id, role, content)
VALUES (%(id)s, %(task_id)s, %(role)s, %(content)s)
ON CONFLICT (id) DO NOTHING
RETURNING id

-- name: get_message
SELECT id, task_id, role, content, run_id, prompt_tokens, completion_tokens, created_at
FROM messages WHERE id = %(id)s

-- name: conversation
-- The task's messages up to and including the given one (found by its ID), oldest first.
SELECT m.role, m.content
FROM messages m, messages upto
WHERE upto.id = %(message_id)s
  AND m.task_id = upto.task_id
  AND (m.created_at, m.id) <= (upto.created_at, upto.id)
ORDER BY m.created_at, m.id

-- name: create_run
INSERT INTO runs (id, task_id, job, user_message_id, assistant_message_id)
VALUES (%(id)s, %(task_id)s, %(job)s, %(user_message_id)s, %(assistant_message_id)s)
RETURNING id

-- name: get_run
SELECT id, task_id, job, user_message_id, assistant_message_id, status, attempts,
       prompt_tokens, completion_tokens, total_tokens, error,
       created_at, started_at, finished_at, finalized_at
FROM runs WHERE id = %(id)s

-- name: find_run_by_user_message
SELECT id FROM runs WHERE user_message_id = %(user_message_id)s

-- name: start_run
-- Counts this attempt; no row when the run has already ended.
UPDATE runs SET status = 'running', attempts = attempts + 1, started_at = coalesce(started_at, now())
WHERE id = %(id)s AND status IN ('queued', 'running')
RETURNING attempts

-- name: write_assistant_message
-- By the ID the run was given at creation: a second attempt overwrites, never adds.
INSERT INTO messages (id, task_id, role, content, run_id, prompt_tokens, completion_tokens)
VALUES (%(id)s, %(task_id)s, 'assistant', %(content)s, %(run_id)s, %(prompt_tokens)s, %(completion_tokens)s)
ON CONFLICT (id) DO UPDATE
    SET content = EXCLUDED.content, prompt_tokens = EXCLUDED.prompt_tokens,
        completion_tokens = EXCLUDED.completion_tokens, updated_at = clock_timestamp()
    WHERE messages.run_id = EXCLUDED.run_id

-- name: complete_run
UPDATE runs SET status = 'completed', finished_at = now(), error = NULL,
       prompt_tokens = %(prompt_tokens)s, completion_tokens = %(completion_tokens)s,
       total_tokens = %(prompt_tokens)s + %(completion_tokens)s
WHERE id = %(id)s AND status IN ('queued', 'running')
RETURNING id

-- name: fail_run
UPDATE runs SET status = 'failed', finished_at = now(), error = %(error)s
WHERE id = %(id)s AND status IN ('queued', 'running')
RETURNING id

-- name: cancel_run
-- A run is cancelled (POST /api/runs/{id}/cancel): a queued one by the route (its job never starts), a
-- running one (running = true) by its job's cancel hook, which keeps the partial reply. No row: it had ended.
UPDATE runs SET status = 'cancelled', finished_at = now(), error = %(error)s
WHERE id = %(id)s AND (status = 'queued' OR (%(running)s AND status = 'running'))
RETURNING id

-- name: mark_finalized
UPDATE runs SET finalized_at = coalesce(finalized_at, now()) WHERE id = %(id)s

-- name: round
-- One round by its assistant message: the run, the user's message and the reply.
SELECT r.id, u.content, a.content
FROM runs r
JOIN messages u ON u.id = r.user_message_id
JOIN messages a ON a.id = r.assistant_message_id
WHERE r.assistant_message_id = %(message_id)s AND r.task_id = %(task_id)s

-- name: upsert_memory
INSERT INTO memories (user_id, key, value, source_task_id, source_message_id)
VALUES (%(user_id)s, %(key)s, %(value)s, %(task_id)s, %(message_id)s)
ON CONFLICT (user_id, key) DO UPDATE
    SET value = EXCLUDED.value, source_task_id = EXCLUDED.source_task_id,
        source_message_id = EXCLUDED.source_message_id, updated_at = now()

-- name: record_extraction
INSERT INTO memory_extractions (message_id, task_id, user_id, memories, started_at, finished_at)
VALUES (%(message_id)s, %(task_id)s, %(user_id)s, %(memories)s, %(started_at)s, clock_timestamp())
ON CONFLICT (message_id) DO UPDATE
    SET memories = EXCLUDED.memories, started_at = EXCLUDED.started_at, finished_at = EXCLUDED.finished_at

-- name: clock
SELECT clock_timestamp()

-- name: memories
SELECT key, value, source_task_id, source_message_id, updated_at
FROM memories WHERE user_id = %(user_id)s ORDER BY key

-- name: upsert_resource
-- A new version replaces title and body; the same version changes nothing. An id is its user's own.
INSERT INTO resources (id, user_id, task_id, title, body, version)
VALUES (%(id)s, %(user_id)s, %(task_id)s, %(title)s, %(body)s, %(version)s)
ON CONFLICT (user_id, id) DO UPDATE
    SET title = EXCLUDED.title, body = EXCLUDED.body, version = EXCLUDED.version, updated_at = now()
    WHERE resources.version <> EXCLUDED.version

-- name: get_resource
-- Without a user (a job enqueued before ids were each user's, migration 0062): the oldest of that id.
SELECT id, user_id, task_id, title, body, version, indexed_version, indexed_at FROM resources
WHERE id = %(id)s AND (%(user_id)s::text IS NULL OR user_id = %(user_id)s::text)
ORDER BY created_at LIMIT 1

-- name: lock_resource
-- Held for the indexing transaction, so two index jobs of one resource take turns.
SELECT user_id, title, body, version, indexed_version FROM resources
WHERE id = %(id)s AND (%(user_id)s::text IS NULL OR user_id = %(user_id)s::text)
ORDER BY created_at LIMIT 1
FOR UPDATE

-- name: delete_resource_chunks
DELETE FROM resource_chunks WHERE user_id = %(user_id)s AND resource_id = %(id)s

-- name: insert_resource_chunk
INSERT INTO resource_chunks (user_id, resource_id, seq, version, body)
VALUES (%(user_id)s, %(id)s, %(seq)s, %(version)s, %(body)s)

-- name: mark_indexed
UPDATE resources SET indexed_version = %(version)s, indexed_at = now() WHERE user_id = %(user_id)s AND id = %(id)s

-- name: search_resources
-- Best chunks first; a resource appears once per matching chunk.
SELECT c.resource_id, r.title, c.seq,
       -- Matches marked with control characters (chr 2, 3): records.safe_snippet escapes, then makes them <b>.
       ts_headline('english', c.body, q, 'MaxWords=30, MinWords=10, StartSel=' || chr(2) || ', StopSel=' || chr(3))
           AS snippet,
       ts_rank(c.tsv, q) AS rank
FROM resource_chunks c
JOIN resources r ON r.user_id = c.user_id AND r.id = c.resource_id,
     websearch_to_tsquery('english', %(q)s) AS q
WHERE c.tsv @@ q AND (%(user_id)s::text IS NULL OR r.user_id = %(user_id)s::text)
ORDER BY rank DESC, c.resource_id, c.seq
LIMIT %(limit)s

-- -- ownership: every producer read and write is one user's -----------------

-- name: get_task_of_user
SELECT id, user_id, kind, title, instructions, created_at FROM tasks WHERE id = %(id)s AND user_id = %(user_id)s

-- name: get_run_of_user
SELECT r.id, r.task_id, r.job, r.user_message_id, r.assistant_message_id, r.status, r.attempts,
       r.prompt_tokens, r.completion_tokens, r.total_tokens, r.error,
       r.created_at, r.started_at, r.finished_at, r.finalized_at
FROM runs r JOIN tasks t ON t.id = r.task_id
WHERE r.id = %(id)s AND t.user_id = %(user_id)s

-- name: stranded_runs
-- Runs still queued well after they were created: their enqueue may never have happened (the process
-- died between the run's commit and its enqueue, or the enqueue's outcome was unknown). Oldest first.
SELECT id, task_id, job FROM runs
WHERE status = 'queued' AND created_at < now() - make_interval(secs => %(older_than)s)
ORDER BY created_at LIMIT %(limit)s
