-- Named queries of the Postgres broker, run only by jobs.py (the one class
-- that talks to Postgres). The table is described in
-- conveyor/schema/migrations/0010_jobs.sql.

-- name: enqueue
-- Insert a batch of jobs; a row whose id or key is taken is skipped (the
-- caller then looks the key's holder up). One NOTIFY per queue that got a
-- job, sent when the enqueue's transaction commits, wakes idle workers.
WITH ins AS (
    INSERT INTO conveyor_jobs AS j (id, queue, job, priority, rank_lead, max_attempts, job_key, key_expires_at,
                                    message, error, available_at, job_group)
    SELECT i.id, i.queue, i.job, i.priority, i.rank_lead, i.max_attempts, i.job_key,
           CASE WHEN i.job_key IS NOT NULL THEN now() + make_interval(secs => %(dedup_ttl)s) END,
           i.message::jsonb, i.error, now() + make_interval(secs => i.delay), i.job_group
    FROM unnest(%(ids)s::text[], %(queues)s::text[], %(jobs)s::text[], %(priorities)s::int[],
                %(rank_leads)s::float8[], %(max_attempts)s::int[], %(keys)s::text[], %(messages)b::text[],
                %(errors)s::text[], %(delays)s::float8[], %(groups)s::text[])
         AS i(id, queue, job, priority, rank_lead, max_attempts, job_key, message, error, delay, job_group)
    ON CONFLICT DO NOTHING
    RETURNING j.id, j.queue, j.job_group
), held AS (
    -- Each named group's row is held (FOR KEY SHARE: enqueues and claims pass; prune_groups
    -- does not) until this enqueue commits, so the group prune cannot delete it under a job
    -- it does not see yet (lock_idle_groups, prune_groups). Claims lock with FOR NO KEY UPDATE:
    -- no conflict.
    -- In (queue, group) order, as are the rows made below: two batches lock shared groups in
    -- the same order, so they cannot deadlock over rows both make.
    SELECT w.queue, w.job_group, k.found
    FROM (SELECT DISTINCT queue, job_group FROM ins WHERE job_group <> '' ORDER BY queue, job_group) w
    LEFT JOIN LATERAL (SELECT true AS found FROM conveyor_job_groups g
                       WHERE g.queue = w.queue AND g.job_group = w.job_group
                       FOR KEY SHARE) k ON true
), groups AS (
    -- A group not found: made, or (made by another transaction since this statement's
    -- snapshot) locked by the no-op update, which waits for its maker and locks the row.
    INSERT INTO conveyor_job_groups (queue, job_group)
    SELECT queue, job_group FROM held WHERE found IS NULL ORDER BY queue, job_group
    ON CONFLICT (queue, job_group) DO UPDATE SET last_served = conveyor_job_groups.last_served WHERE false
), rotation AS (
    -- A queue's first named group makes it a grouped queue (claim_groups), with
    -- the default group '' (jobs without a group) as one more group of its rotation
    -- (never pruned: the queue stays grouped, see claim in jobs.py).
    INSERT INTO conveyor_job_groups (queue, job_group)
    SELECT DISTINCT queue, '' FROM held
    ON CONFLICT DO NOTHING
), woke AS (
    SELECT pg_notify(%(channel)s, q.queue) FROM (SELECT DISTINCT queue FROM ins) q
)
SELECT ins.id, (SELECT count(*) FROM woke) FROM ins

-- name: key_holders
-- Who holds these keys, and whether their hold is still within the dedup TTL.
SELECT job_key, id, key_expires_at > now() AS live
FROM conveyor_jobs WHERE job_key = ANY(%(keys)s::text[])

-- name: release_expired_keys
UPDATE conveyor_jobs SET job_key = NULL
WHERE job_key = ANY(%(keys)s::text[]) AND key_expires_at <= now()

-- name: claim
-- Claim up to `limit` runnable jobs in one statement: lock them skipping
-- rows other workers hold, mark them in progress, stamp the pick time and
-- the worker, count the delivery. Lowest rank first (rank_at: available
-- time minus priority x aging, kept by a trigger, migration 0074; the index
-- conveyor_jobs_group_pending (0075) is in this order within a group, the
-- default group '' included, so the claim stays an index scan).
-- The delivery number is the fence of every later start, outcome, retry and
-- final-failure claim, and must never be handed out twice, not even after a
-- crash: a claim commits asynchronously and is proven durable before any of
-- its jobs starts (durability.py), or commits synchronously when it cannot be.
WITH picked AS (
    SELECT id FROM conveyor_jobs
    WHERE queue = %(queue)s AND status = 'pending' AND available_at <= now()
      AND NOT EXISTS (SELECT 1 FROM conveyor_paused_queues p WHERE p.queue = %(queue)s)
      AND job_group = ''  -- a named group's jobs are claim_groups' only (fair shares, caps)
    ORDER BY rank_at, priority DESC
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
)
UPDATE conveyor_jobs j
SET status = 'in_progress', delivery = j.delivery + 1, worker_id = %(worker)s, picked_at = now()
FROM picked WHERE j.id = picked.id
RETURNING j.id, j.queue, j.job, j.delivery, j.rank_at, -j.priority, j.message::text,
          j.final_failure_at IS NOT NULL,
          -- The queue has named groups now (one index probe per claim): claim_groups from the next claim on.
          EXISTS (SELECT 1 FROM conveyor_job_groups g WHERE g.queue = %(queue)s)

-- name: has_groups
-- Whether the queue ever had a named group: then claim_groups claims its jobs.
SELECT EXISTS (SELECT 1 FROM conveyor_job_groups WHERE queue = %(queue)s)

-- name: lock_groups
-- The grouped claim, first statement (claim_groups runs next, in the same
-- transaction): lock up to `limit` groups of the queue that have a runnable
-- job, lowest pass first (stride scheduling in virtual time, migration 0077:
-- the group owed the most turns for its weight). A group another claimer
-- holds is skipped, so two claimers never count the same group's slots at
-- once (FOR NO KEY UPDATE: an enqueue's FOR KEY SHARE on the row does not
-- hold it). A capped group (`cap`: CONVEYOR_QUEUES__<Q>__GROUP_CONCURRENCY)
-- already at its cap is passed over; the default group '' has no cap.
-- Each group comes with its start, its pass or the queue's virtual time
-- (its groups' highest vstart) if that is later, so a group back from idle
-- banks no credit, and its weight: the queue's settings' (`configured`, JSON
-- group -> weight), else its row's.
-- The runnable check is a LATERAL probe in the index's order with a LIMIT:
-- one index probe per group. As EXISTS, the planner may turn it into a scan
-- of every waiting row; unordered, into a sequential scan.
SELECT g.job_group,
       greatest(g.pass, (SELECT coalesce(max(m.vstart), 0) FROM conveyor_job_groups m WHERE m.queue = %(queue)s)),
       coalesce((%(configured)s::jsonb ->> g.job_group)::int, g.weight)
FROM conveyor_job_groups g
CROSS JOIN LATERAL (SELECT 1 FROM conveyor_jobs j
                    WHERE j.queue = %(queue)s AND j.job_group = g.job_group AND j.status = 'pending'
                      AND j.available_at <= now()
                    ORDER BY j.rank_at, j.priority DESC
                    LIMIT 1) AS runnable
WHERE g.queue = %(queue)s
  AND NOT EXISTS (SELECT 1 FROM conveyor_paused_queues p WHERE p.queue = %(queue)s)
  AND (%(cap)s::int IS NULL OR g.job_group = ''
       OR (SELECT count(*) FROM conveyor_jobs h
           WHERE h.queue = g.queue AND h.job_group = g.job_group AND h.status = 'in_progress') < %(cap)s)
ORDER BY g.pass, g.job_group
LIMIT %(limit)s
FOR NO KEY UPDATE OF g SKIP LOCKED

-- name: pick_groups
-- lock_groups for a queue without a cap: the same rotation, no locks. With
-- no slots to count, claimers need not take turns; each claims different
-- jobs of the same groups (claim_groups' SKIP LOCKED).
SELECT g.job_group,
       greatest(g.pass, (SELECT coalesce(max(m.vstart), 0) FROM conveyor_job_groups m WHERE m.queue = %(queue)s)),
       coalesce((%(configured)s::jsonb ->> g.job_group)::int, g.weight)
FROM conveyor_job_groups g
CROSS JOIN LATERAL (SELECT 1 FROM conveyor_jobs j
                    WHERE j.queue = %(queue)s AND j.job_group = g.job_group AND j.status = 'pending'
                      AND j.available_at <= now()
                    ORDER BY j.rank_at, j.priority DESC
                    LIMIT 1) AS runnable
WHERE g.queue = %(queue)s
  AND NOT EXISTS (SELECT 1 FROM conveyor_paused_queues p WHERE p.queue = %(queue)s)
ORDER BY g.pass, g.job_group
LIMIT %(limit)s

-- name: claim_groups
-- The grouped claim, second statement: a fresh snapshot (READ COMMITTED)
-- taken while this transaction holds the groups' locks, so each group's
-- held count includes every claim of it that committed before (a claimer
-- commits before it lets the lock go). Each group (`groups`, with the
-- `starts` and `weights` lock_groups gave) gets up to its room (cap minus
-- held, or `limit`), oldest first in the queue's order; the picks are
-- ordered by virtual finish time, a group's n-th job at start + n/weight
-- (ties: rotation order), up to `limit`: with weights 3:1, three of the
-- first group's to one of the second's. Each group served moves its pass on
-- by its jobs / its weight, from its start (or its pass, if another claimer
-- moved it past that since), and its vstart to that start. Weights only
-- order the picks: the claim itself is fenced and counted like claim.
WITH g AS (
    SELECT l.job_group, l.ord, l.start, greatest(1, l.weight) AS weight,
           CASE WHEN %(cap)s::int IS NULL OR l.job_group = '' THEN %(limit)s
                ELSE greatest(0, %(cap)s - (SELECT count(*) FROM conveyor_jobs h
                                            WHERE h.queue = %(queue)s AND h.job_group = l.job_group
                                              AND h.status = 'in_progress'))::int
           END AS room
    FROM unnest(%(groups)s::text[], %(starts)s::float8[], %(weights)s::int[]) WITH ORDINALITY
         AS l(job_group, start, weight, ord)
), candidates AS (
    SELECT c.id, g.job_group, g.ord, g.start, g.weight,
           g.start + (row_number() OVER (PARTITION BY g.ord ORDER BY c.rank_at, c.priority DESC))::float8 / g.weight
               AS tag
    FROM g CROSS JOIN LATERAL (
        SELECT j.id, j.priority, j.rank_at FROM conveyor_jobs j
        WHERE j.queue = %(queue)s AND j.job_group = g.job_group AND j.status = 'pending'
          AND j.available_at <= now()
        ORDER BY j.rank_at, j.priority DESC
        LIMIT least(g.room, %(limit)s)
        FOR UPDATE SKIP LOCKED
    ) c
), picked AS (
    SELECT id, job_group, tag, ord, start, weight FROM candidates ORDER BY tag, ord LIMIT %(limit)s
), served AS (
    -- A group another claimer holds is left to it to move (SKIP LOCKED): claimers of an
    -- uncapped queue (pick_groups, no group locks) neither wait on nor deadlock with each other.
    UPDATE conveyor_job_groups s
    SET last_served = clock_timestamp(),
        pass = greatest(s.pass, l.start) + l.taken::float8 / l.weight,
        vstart = greatest(s.vstart, l.start)
    FROM (SELECT k.queue, k.job_group, p.start, p.weight, p.taken FROM conveyor_job_groups k
          JOIN (SELECT job_group, min(start) AS start, min(weight) AS weight, count(*) AS taken
                FROM picked GROUP BY job_group) p ON p.job_group = k.job_group
          WHERE k.queue = %(queue)s
          FOR NO KEY UPDATE OF k SKIP LOCKED) l
    WHERE s.queue = l.queue AND s.job_group = l.job_group
)
UPDATE conveyor_jobs j
SET status = 'in_progress', delivery = j.delivery + 1, worker_id = %(worker)s, picked_at = now()
FROM picked WHERE j.id = picked.id
RETURNING j.id, j.queue, j.job, j.delivery, picked.tag, picked.ord, j.message::text,
          j.final_failure_at IS NOT NULL

-- name: next_due
-- Seconds until the queue's next pending job is runnable (NULL: none, or
-- the queue is paused). At most 0 when one is runnable already: rows
-- another worker had locked during the claim, or just turned due.
-- A runnable row is looked for first, and found at the head of the queue's
-- pending index: a claim comes back short under SKIP LOCKED with jobs still
-- waiting, and min(available_at) over them (no index has that order) read
-- every pending row: 0.7 s of server CPU per call with a million waiting
-- (bench/RESULTS-scale.md). The min is taken only when nothing is runnable:
-- an empty queue, or one of delayed jobs only.
SELECT CASE
    WHEN EXISTS (SELECT 1 FROM conveyor_paused_queues p WHERE p.queue = %(queue)s) THEN NULL
    -- In the index's order (queue, job_group, rank_at). A runnable row has rank_at <= now()
    -- (rank_at = available_at minus a lead >= 0), tested on the index entry itself: the rows
    -- fetched from the heap are the candidates, not every delayed job of the queue.
    WHEN (SELECT true FROM conveyor_jobs
          WHERE queue = %(queue)s AND status = 'pending' AND rank_at <= now() AND available_at <= now()
          ORDER BY job_group, rank_at LIMIT 1) THEN 0::float8
    ELSE (SELECT extract(epoch FROM min(available_at) - now())::float8
          FROM conveyor_jobs WHERE queue = %(queue)s AND status = 'pending')
END

-- name: start
-- A claimed job starts: count the attempt. No row when the job was deleted
-- or this delivery is no longer the current one.
-- Safe to repeat (a start whose reply was lost): a delivery counts its attempt once.
-- A job whose cancellation was asked (cancel_requested_at) does not start:
-- the current delivery ends it cancelled in the same statement (-2).
-- One UPDATE decides on the row it locked: a cancel that commits while the
-- start waits for the row is seen (two UPDATEs, one per case, each judged
-- the row on the statement's snapshot and neither matched: the start read
-- as "deleted", and the ack after it completed a job that never ran).
UPDATE conveyor_jobs
SET status = CASE WHEN cancel_requested_at IS NULL THEN status ELSE 'cancelled' END,
    completed_at = CASE WHEN cancel_requested_at IS NULL THEN completed_at ELSE now() END,
    worker_id = CASE WHEN cancel_requested_at IS NULL THEN worker_id END,
    attempt = CASE WHEN cancel_requested_at IS NULL AND started_delivery IS DISTINCT FROM %(delivery)s
                   THEN attempt + 1 ELSE attempt END,
    started_delivery = CASE WHEN cancel_requested_at IS NULL THEN %(delivery)s ELSE started_delivery END,
    started_at = CASE WHEN cancel_requested_at IS NULL THEN now() ELSE started_at END
WHERE id = %(id)s AND delivery = %(delivery)s AND status = 'in_progress'
RETURNING CASE WHEN cancel_requested_at IS NULL THEN attempt ELSE -2 END AS attempt

-- name: finish
-- Apply a batch of outcomes of current deliveries: done, failed (with the
-- error) or pending (handed back unstarted). Outcomes of superseded
-- deliveries match no row. Totals move in the same statement.
WITH f AS (
    SELECT * FROM unnest(%(ids)s::text[], %(deliveries)s::int[], %(statuses)s::text[], %(errors)s::text[])
        AS f(id, delivery, status, error)
), moved AS (
    UPDATE conveyor_jobs j
    SET status = f.status,
        error = CASE WHEN f.status = 'pending' THEN j.error ELSE f.error END,
        completed_at = CASE WHEN f.status = 'pending' THEN NULL ELSE now() END,
        worker_id = NULL,
        picked_at = CASE WHEN f.status = 'pending' THEN NULL ELSE j.picked_at END
    FROM f
    WHERE j.id = f.id AND j.delivery = f.delivery AND j.status = 'in_progress'
    RETURNING j.queue, j.status
), totals AS (
    INSERT INTO conveyor_queue_totals AS t (queue, slot, completed, failed)
    SELECT queue, %(slot)s, count(*) FILTER (WHERE status = 'done'), count(*) FILTER (WHERE status = 'failed')
    FROM moved WHERE status <> 'pending' GROUP BY queue
    ON CONFLICT (queue, slot) DO UPDATE
        SET completed = t.completed + EXCLUDED.completed, failed = t.failed + EXCLUDED.failed
)
SELECT count(*) FROM moved

-- name: complete_in_transaction
-- The current delivery completes its job inside the caller's own transaction
-- (ctx.transaction, ctx.complete_in), with the caller's effects: both commit
-- or neither. The row stays locked until that transaction ends, so recovery
-- (SKIP LOCKED) cannot take the job back meanwhile. No row when the delivery
-- is no longer current (taken back, handed to another delivery, deleted or
-- ended): the caller raises DeliveryFenced and its transaction rolls back.
-- The total's row is locked until the caller's (synchronous) commit, so it is
-- the connection's own slot (from `first_slot`, one of `slots` by backend pid),
-- never a random one another completion may hold: concurrent transactions
-- would otherwise queue on one another's commits (issue 18).
WITH moved AS (
    UPDATE conveyor_jobs
    SET status = 'done', error = NULL, completed_at = now(), worker_id = NULL
    WHERE id = %(id)s AND delivery = %(delivery)s AND status = 'in_progress'
    RETURNING queue
), totals AS (
    INSERT INTO conveyor_queue_totals AS t (queue, slot, completed)
    SELECT queue, %(first_slot)s + pg_backend_pid() %% %(slots)s, 1 FROM moved
    ON CONFLICT (queue, slot) DO UPDATE SET completed = t.completed + 1
)
SELECT count(*) FROM moved

-- name: is_current
-- Whether this delivery is still the job's current one (ctx.check_fence): one
-- primary-key read. A job this delivery completed stays current for it; a job
-- taken back keeps its delivery number while pending, so the status tells.
SELECT EXISTS (SELECT 1 FROM conveyor_jobs
               WHERE id = %(id)s AND delivery = %(delivery)s AND status IN ('in_progress', 'done'))

-- name: retry
-- The current delivery failed and runs again after `delay` seconds (a
-- retry's backoff, or RetryLater): back to pending with its new message.
WITH r AS (
    UPDATE conveyor_jobs
    SET status = 'pending', available_at = now() + make_interval(secs => %(delay)s),
        message = %(message)s::jsonb, error = %(error)s, worker_id = NULL, picked_at = NULL,
        wait_event = NULL
    WHERE id = %(id)s AND delivery = %(delivery)s AND status = 'in_progress'
    RETURNING queue
)
SELECT pg_notify(%(channel)s, queue) FROM r

-- name: event_lock
-- Serialises a park and a signal of one event (their statements run after it,
-- in its transaction, so each sees what the other committed).
SELECT pg_advisory_xact_lock(hashtextextended('conveyor-event:' || %(event)s, 0))

-- name: park
-- The current delivery parks its job awaiting `event` (ctx.wait_for): pending,
-- due at its timeout, with wait_event set; or, when a kept signal of the event
-- exists, due at once with its resolution recorded. Run under event_lock.
WITH fact AS (
    SELECT resolution FROM conveyor_events WHERE name = %(event)s AND expires_at > now()
), parked AS (
    UPDATE conveyor_jobs
    SET status = 'pending',
        available_at = CASE WHEN EXISTS (SELECT 1 FROM fact) THEN now()
                            ELSE now() + make_interval(secs => %(delay)s) END,
        wait_event = CASE WHEN EXISTS (SELECT 1 FROM fact) THEN NULL ELSE %(event)s END,
        message = %(message)s::jsonb, error = %(error)s, worker_id = NULL, picked_at = NULL
    WHERE id = %(id)s AND delivery = %(delivery)s AND status = 'in_progress'
    RETURNING id, queue, wait_event IS NULL AS resolved
), resolved AS (
    INSERT INTO conveyor_job_waits (job_id, name, resolution)
    SELECT parked.id, %(event)s, fact.resolution FROM parked, fact WHERE parked.resolved
    ON CONFLICT DO NOTHING
)
SELECT pg_notify(%(channel)s, queue) FROM parked

-- name: signal
-- Every row awaiting `event` is due now, its wait cleared and its resolution
-- recorded insert-first; a row no longer awaiting (resumed, claimed at its
-- timeout, deleted) matches nothing, so a job resumes once. The signal is kept
-- for `ttl` seconds (an unexpired earlier one stays). Run under event_lock.
WITH woken AS (
    UPDATE conveyor_jobs SET available_at = now(), wait_event = NULL
    WHERE wait_event = %(event)s AND status = 'pending'
    RETURNING id, queue
), resolved AS (
    INSERT INTO conveyor_job_waits (job_id, name, resolution)
    SELECT id, %(event)s, %(resolution)s FROM woken
    ON CONFLICT DO NOTHING
), kept AS (
    INSERT INTO conveyor_events AS e (name, resolution, expires_at)
    VALUES (%(event)s, %(resolution)s, now() + make_interval(secs => %(ttl)s))
    ON CONFLICT (name) DO UPDATE SET resolution = EXCLUDED.resolution, expires_at = EXCLUDED.expires_at
        WHERE e.expires_at <= now()
), expired AS (
    DELETE FROM conveyor_events WHERE name IN (
        SELECT name FROM conveyor_events WHERE expires_at < now() AND name <> %(event)s LIMIT 100
    )
), woke AS (
    SELECT pg_notify(%(channel)s, queue) FROM (SELECT DISTINCT queue FROM woken) q
)
SELECT (SELECT count(*) FROM woken), (SELECT count(*) FROM woke)

-- name: resolve_wait
-- The job's resolution of its wait for `event`, or one recorded now
-- (insert-first): a kept signal's, or a timeout's when the job came back from
-- a park on it without one. No row: the job is to park.
WITH found AS (
    SELECT resolution FROM conveyor_job_waits WHERE job_id = %(id)s AND name = %(event)s
), fresh AS (
    SELECT coalesce(
        (SELECT resolution FROM conveyor_events WHERE name = %(event)s AND expires_at > now()),
        CASE WHEN %(timed_out)s::boolean THEN '{"timeout":true}' END
    ) AS resolution
    WHERE NOT EXISTS (SELECT 1 FROM found)
), recorded AS (
    INSERT INTO conveyor_job_waits (job_id, name, resolution)
    SELECT %(id)s, %(event)s, resolution FROM fresh
    WHERE resolution IS NOT NULL AND EXISTS (SELECT 1 FROM conveyor_jobs WHERE id = %(id)s)
    ON CONFLICT DO NOTHING
    RETURNING resolution
)
SELECT resolution FROM found UNION ALL SELECT resolution FROM recorded

-- name: fail_malformed
-- A claimed row whose message cannot be decoded fails alone. Returns
-- whether this call claimed the job's final failure.
WITH old AS (
    SELECT id, final_failure_at IS NULL AS unclaimed FROM conveyor_jobs
    WHERE id = %(id)s AND delivery = %(delivery)s AND status = 'in_progress'
    FOR UPDATE
), moved AS (
    UPDATE conveyor_jobs j
    SET status = 'failed', error = %(error)s, completed_at = now(), worker_id = NULL,
        final_failure_at = coalesce(j.final_failure_at, now())
    FROM old WHERE j.id = old.id
    RETURNING j.queue, old.unclaimed
), totals AS (
    INSERT INTO conveyor_queue_totals AS t (queue, slot, failed)
    SELECT queue, %(slot)s, 1 FROM moved
    ON CONFLICT (queue, slot) DO UPDATE SET failed = t.failed + 1
)
SELECT unclaimed FROM moved

-- name: claim_final_failure
-- The current delivery claims the final-failure hooks: the claim names the
-- delivery (synchronously written) and the row stays held. The nack that
-- follows the hooks marks them done: the row becomes failed (finish). If
-- the worker dies in between, recovery puts the row back to pending with
-- its claim kept, and the next claim hands it out as a finalize delivery,
-- which claims again and runs the hooks only (at least once, never the
-- body). A superseded delivery claims nothing: another one holds the job.
-- A repeat after a lost reply claims again.
UPDATE conveyor_jobs
SET final_failure_at = coalesce(final_failure_at, now()), final_failure_delivery = %(delivery)s, error = %(error)s
WHERE id = %(id)s AND delivery = %(delivery)s AND status = 'in_progress'
RETURNING id

-- name: worker_session
-- Starts, outcomes and retries commit without waiting for the WAL flush
-- (jobs.py, WORKER_SYNCHRONOUS_COMMIT says why that is safe; claims do wait).
SET synchronous_commit = off

-- name: prover_session
-- The claim prover's connection, and the broker's synchronous pool (enqueues,
-- synchronous claims, final failures, recovery), commit synchronously,
-- whatever the server's or the role's default.
SET synchronous_commit = on

-- name: prove
-- A transaction that writes WAL, committed synchronously: its flush also
-- flushes every claim committed before it (durability.py). A transactional
-- logical message is the smallest such write: it touches no table. (A
-- transaction that only takes an id, txid_current(), writes no WAL before
-- its commit record, and Postgres does not flush such a commit.)
SELECT pg_logical_emit_message(true, 'conveyor.claims', '')

-- name: listen
-- The channel is jobs.py's CHANNEL; the enqueue's NOTIFY names the queue.
LISTEN conveyor_jobs

-- name: heartbeat
INSERT INTO conveyor_workers (id, hostname, pid, queues, heartbeat_at)
VALUES (%(id)s, %(hostname)s, %(pid)s, %(queues)s, now())
ON CONFLICT (id) DO UPDATE SET heartbeat_at = now(), queues = EXCLUDED.queues

-- name: forget_worker
DELETE FROM conveyor_workers WHERE id = %(id)s

-- name: recover
-- Rows held by workers whose heartbeat is older than the lease (or who
-- are gone) go back to pending as new claims will find them. SKIP LOCKED
-- and the re-check of status and worker under the row lock make
-- concurrent passes take each row once. Nothing is taken until the
-- server has been up for a lease (its own clock): after a restart every
-- heartbeat is old, and live workers need that long to reconnect and write
-- a fresh one. A row whose attempts are spent gets its final-failure claim
-- (WorkerLost) here; it and a row whose hooks were claimed but never marked
-- done (its worker died in them) are handed out next as finalize
-- deliveries, which run the hooks only, in a worker. Returns the moved rows:
-- finalizing, and lost (this pass failed it). `now` is the server's clock
-- unless a test passes one. Nothing is taken while a clock step's re-arm
-- (conveyor_recovery_clock) runs; one more than a lease ahead can only
-- come from a backward step and is ignored. Nothing is taken either when
-- this statement's clock is not the one the step check just read
-- (`checked` UNIX s, give or take `within` s): a connection to a server
-- whose clock differs.
WITH t AS (
    SELECT coalesce(%(now)s::timestamptz, now()) AS now
), stuck AS (
    SELECT j.id, j.final_failure_at IS NOT NULL AS claimed,
           -- A job whose cancellation was asked is not failed here: its next start ends it cancelled.
           coalesce(j.attempt >= j.max_attempts
                    + coalesce((j.message -> 'options' ->> 'deferrals')::int, 0), false)
               AND j.cancel_requested_at IS NULL AS spent
    FROM conveyor_jobs j
    CROSS JOIN t
    WHERE j.status = 'in_progress'
      AND (%(checked)s::float8 IS NULL
           OR abs(extract(epoch FROM t.now) - %(checked)s::float8) <= %(within)s::float8)
      -- A start time in the future: the clock went back (recovery's step check re-arms for a lease).
      AND (pg_postmaster_start_time() <= t.now - make_interval(secs => %(lease)s)
           OR pg_postmaster_start_time() > t.now)
      AND NOT EXISTS (SELECT 1 FROM conveyor_recovery_clock c
                      WHERE c.resumes_at > t.now AND c.resumes_at <= t.now + make_interval(secs => %(lease)s))
      AND NOT EXISTS (SELECT 1 FROM conveyor_workers w
                      WHERE w.id = j.worker_id
                        AND w.heartbeat_at >= t.now - make_interval(secs => %(lease)s))
    ORDER BY j.picked_at
    LIMIT %(limit)s
    FOR UPDATE OF j SKIP LOCKED
)
UPDATE conveyor_jobs j
SET status = 'pending',
    error = CASE WHEN s.spent AND NOT s.claimed
                 THEN 'WorkerLost: the worker died (stopped heartbeating) during attempt '
                      || j.attempt || ', the last one'
                 ELSE j.error END,
    final_failure_at = CASE WHEN s.spent THEN coalesce(j.final_failure_at, now()) ELSE j.final_failure_at END,
    worker_id = NULL, picked_at = NULL
FROM stuck s WHERE j.id = s.id
RETURNING j.id, j.queue, j.job, s.claimed OR s.spent, s.spent AND NOT s.claimed, j.attempt, j.error

-- name: server_clock
-- The server's clock (or the test's `now`) for recovery's step check, in
-- UNIX seconds. Heartbeats stamped ahead of it (the clock was stepped back)
-- are brought back to it, so a dead worker looks alive at most one more
-- lease, never for as long as the step.
WITH t AS (
    SELECT coalesce(%(now)s::timestamptz, now()) AS now
), clamped AS (
    UPDATE conveyor_workers w SET heartbeat_at = t.now
    FROM t WHERE w.heartbeat_at > t.now + make_interval(secs => %(slack)s)
    RETURNING w.id
)
SELECT extract(epoch FROM t.now)::float8, (SELECT count(*) FROM clamped) FROM t

-- name: rearm_recovery
-- The server's clock was stepped: nobody is declared dead for one lease,
-- counted on the new clock (either way: a re-arm set before a backward
-- step is re-based too).
INSERT INTO conveyor_recovery_clock AS c (id, resumes_at)
VALUES (1, coalesce(%(now)s::timestamptz, now()) + make_interval(secs => %(lease)s))
ON CONFLICT (id) DO UPDATE SET resumes_at = EXCLUDED.resumes_at

-- name: release_orphans
-- Rows this live worker holds but no longer knows about (a claim whose
-- answer was lost with its connection): back to pending.
UPDATE conveyor_jobs SET status = 'pending', worker_id = NULL, picked_at = NULL
WHERE status = 'in_progress' AND worker_id = %(worker)s
  AND picked_at < now() - make_interval(secs => %(lease)s)
  AND id <> ALL(%(held)s::text[])
RETURNING id, queue

-- name: forget_dead_workers
DELETE FROM conveyor_workers
WHERE heartbeat_at < now() - make_interval(secs => %(after)s)

-- name: prune
-- Finished jobs older than the retention, a batch at a time, with their
-- once-guarded steps (conveyor_job_steps: no later delivery can need them).
-- Index-driven at any history size: the queues that have finished jobs are
-- found by a skip scan of conveyor_jobs_history (one probe per queue), then
-- each (queue, status)'s oldest rows are read in completed_at order from the
-- same index. A filter on completed_at alone cannot use that index (queue
-- leads it) and read every finished row's entry on every pass: ~1 s at 10 M
-- rows kept, on every worker process, every minute (bench/RESULTS-scale.md).
WITH RECURSIVE queues AS (
    (SELECT queue FROM conveyor_jobs WHERE status IN ('done', 'failed', 'cancelled') ORDER BY queue LIMIT 1)
    UNION ALL
    SELECT (SELECT j.queue FROM conveyor_jobs j
            WHERE j.status IN ('done', 'failed', 'cancelled') AND j.queue > q.queue
            ORDER BY j.queue LIMIT 1)
    FROM queues q WHERE q.queue IS NOT NULL
), old AS (
    SELECT o.id
    FROM queues q
    CROSS JOIN unnest(ARRAY['done', 'failed', 'cancelled']) AS s(status)
    CROSS JOIN LATERAL (
        SELECT id FROM conveyor_jobs
        WHERE queue = q.queue AND status = s.status
          AND status IN ('done', 'failed', 'cancelled')  -- the index's predicate
          AND completed_at < now() - make_interval(secs => %(retention)s)
        ORDER BY completed_at
        LIMIT %(limit)s
        -- Locked here, past rows another pruner holds: two pruners at once take different batches.
        FOR UPDATE SKIP LOCKED
    ) o
    WHERE q.queue IS NOT NULL
    LIMIT %(limit)s
), gone AS (
    DELETE FROM conveyor_jobs WHERE id IN (
        SELECT j.id FROM conveyor_jobs j
        WHERE j.id IN (SELECT id FROM old)
          AND j.status IN ('done', 'failed', 'cancelled')
          AND j.completed_at < now() - make_interval(secs => %(retention)s)
        FOR UPDATE SKIP LOCKED
    )
    RETURNING id
), steps AS (
    DELETE FROM conveyor_job_steps s USING gone WHERE s.job_id = gone.id
)
SELECT count(*) FROM gone

-- name: prune_orphan_steps
-- Steps older than the retention whose job is no row here (deleted by an
-- operator, or a job of another broker's): a live job keeps its steps.
DELETE FROM conveyor_job_steps WHERE (job_id, step) IN (
    SELECT s.job_id, s.step FROM conveyor_job_steps s
    WHERE s.done_at < now() - make_interval(secs => %(retention)s)
      AND NOT EXISTS (SELECT 1 FROM conveyor_jobs j WHERE j.id = s.job_id)
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
)

-- name: lock_idle_groups
-- The group prune, first statement (prune_groups runs next, in the same
-- transaction): lock up to `limit` named groups not served for `idle` s with
-- no job to run or running. A group whose row an enqueue holds (FOR KEY
-- SHARE, until it commits) or a claimer holds is skipped: the prune never
-- waits. The default group '' is kept: the queue stays grouped.
SELECT g.queue, g.job_group FROM conveyor_job_groups g
WHERE g.job_group <> '' AND g.last_served < now() - make_interval(secs => %(idle)s)
  AND g.weight = 1  -- a weight set for the group is kept (set it to 1 to let the group go)
  AND NOT EXISTS (SELECT 1 FROM conveyor_jobs j
                  WHERE j.queue = g.queue AND j.job_group = g.job_group AND j.status = 'pending')
  AND NOT EXISTS (SELECT 1 FROM conveyor_jobs h
                  WHERE h.queue = g.queue AND h.job_group = g.job_group AND h.status = 'in_progress'
                    AND h.job_group <> '')
LIMIT %(limit)s
FOR UPDATE OF g SKIP LOCKED

-- name: prune_groups
-- The group prune, second statement: delete the locked groups that still
-- have no job to run or running. A fresh snapshot (READ COMMITTED), taken
-- once the locks are held: every enqueue that held a group's row before has
-- committed and its job is seen here; an enqueue after waits for this
-- transaction and makes the row again. No job is left without its group.
-- (In one statement, an enqueue committing between the snapshot and the
-- lock would be missed.) A retried failed job makes its group again too.
DELETE FROM conveyor_job_groups g
USING unnest(%(queues)s::text[], %(groups)s::text[]) AS l(queue, job_group)
WHERE g.queue = l.queue AND g.job_group = l.job_group
  AND NOT EXISTS (SELECT 1 FROM conveyor_jobs j
                  WHERE j.queue = g.queue AND j.job_group = g.job_group AND j.status = 'pending')
  AND NOT EXISTS (SELECT 1 FROM conveyor_jobs h
                  WHERE h.queue = g.queue AND h.job_group = g.job_group AND h.status = 'in_progress'
                    AND h.job_group <> '')

-- name: counts
-- Pending and in-progress rows counted apart, each through its own partial
-- index: one filter on status IN ('pending', 'in_progress') matches neither
-- index's predicate and was a sequential scan of the whole table, history
-- included (1.5 s with 10 M finished rows kept, on every worker's depth
-- sample: bench/RESULTS-scale.md).
WITH p AS (
    SELECT count(*) FILTER (WHERE available_at <= now()) AS waiting,
           count(*) FILTER (WHERE available_at > now() AND wait_event IS NULL) AS delayed,
           count(*) FILTER (WHERE available_at > now() AND wait_event IS NOT NULL) AS awaiting,
           extract(epoch FROM min(available_at) FILTER (WHERE available_at <= now()))::float8 AS oldest_waiting_at
    FROM conveyor_jobs WHERE queue = %(queue)s AND status = 'pending'
), a AS (
    SELECT count(*) AS active, count(*) FILTER (WHERE started_delivery = delivery) AS running
    FROM conveyor_jobs WHERE queue = %(queue)s AND status = 'in_progress'
)
SELECT p.waiting, p.delayed, a.active, a.running,
       (SELECT count(*) FROM conveyor_jobs WHERE queue = %(queue)s AND status = 'failed') AS failed,
       (SELECT count(*) FROM conveyor_jobs WHERE queue = %(queue)s AND status = 'cancelled') AS cancelled,
       (SELECT coalesce(sum(completed), 0) FROM conveyor_queue_totals WHERE queue = %(queue)s) AS completed_total,
       (SELECT coalesce(sum(failed), 0) FROM conveyor_queue_totals WHERE queue = %(queue)s) AS failed_total,
       EXISTS (SELECT 1 FROM conveyor_paused_queues WHERE queue = %(queue)s) AS paused,
       p.oldest_waiting_at, p.awaiting
FROM p, a

-- name: group_counts
-- The named groups of a queue with jobs waiting (ready: not delayed, not awaiting) or held,
-- busiest first, `limit` of them; `total` counts them all (the same on every row).
SELECT job_group,
       count(*) FILTER (WHERE status = 'pending' AND available_at <= now()) AS waiting,
       count(*) FILTER (WHERE status = 'in_progress') AS active,
       extract(epoch FROM min(available_at) FILTER (WHERE status = 'pending' AND available_at <= now()))::float8
           AS oldest_waiting_at,
       count(*) OVER () AS total
FROM conveyor_jobs
WHERE queue = %(queue)s AND job_group <> ''
  AND (status = 'in_progress' OR (status = 'pending' AND available_at <= now()))
GROUP BY job_group
ORDER BY waiting DESC, active DESC, job_group
LIMIT %(limit)s

-- name: get_job
SELECT id, queue, job, status, available_at > now() AS delayed, attempt, job_key, message -> 'args' -> 0,
       error, created_at, started_at, completed_at, available_at, wait_event, priority, nullif(job_group, '')
FROM conveyor_jobs WHERE id = %(id)s

-- name: list_waiting
SELECT id, queue, job, status, false, attempt, job_key, message -> 'args' -> 0,
       error, created_at, started_at, completed_at, available_at, wait_event, priority, nullif(job_group, '')
FROM conveyor_jobs WHERE queue = %(queue)s AND status = 'pending' AND available_at <= now()
ORDER BY available_at DESC LIMIT %(limit)s OFFSET %(offset)s

-- name: list_delayed
SELECT id, queue, job, status, true, attempt, job_key, message -> 'args' -> 0,
       error, created_at, started_at, completed_at, available_at, wait_event, priority, nullif(job_group, '')
FROM conveyor_jobs WHERE queue = %(queue)s AND status = 'pending' AND available_at > now()
  AND wait_event IS NULL
ORDER BY available_at DESC LIMIT %(limit)s OFFSET %(offset)s

-- name: list_awaiting
SELECT id, queue, job, status, true, attempt, job_key, message -> 'args' -> 0,
       error, created_at, started_at, completed_at, available_at, wait_event, priority, nullif(job_group, '')
FROM conveyor_jobs WHERE queue = %(queue)s AND status = 'pending' AND available_at > now()
  AND wait_event IS NOT NULL
ORDER BY available_at DESC LIMIT %(limit)s OFFSET %(offset)s

-- name: list_active
SELECT id, queue, job, status, false, attempt, job_key, message -> 'args' -> 0,
       error, created_at, started_at, completed_at, available_at, wait_event, priority, nullif(job_group, '')
FROM conveyor_jobs WHERE queue = %(queue)s AND status = 'in_progress'
ORDER BY picked_at DESC LIMIT %(limit)s OFFSET %(offset)s

-- name: list_finished
SELECT id, queue, job, status, false, attempt, job_key, message -> 'args' -> 0,
       error, created_at, started_at, completed_at, available_at, wait_event, priority, nullif(job_group, '')
FROM conveyor_jobs WHERE queue = %(queue)s AND status = %(status)s
ORDER BY completed_at DESC LIMIT %(limit)s OFFSET %(offset)s

-- name: pause
INSERT INTO conveyor_paused_queues (queue) VALUES (%(queue)s) ON CONFLICT DO NOTHING

-- name: resume
-- Resuming wakes the queue's workers at once.
WITH gone AS (DELETE FROM conveyor_paused_queues WHERE queue = %(queue)s RETURNING queue)
SELECT pg_notify(%(channel)s, %(queue)s)

-- name: unfinished
-- Jobs of a queue not yet done or failed (broker.join).
SELECT count(*) FROM conveyor_jobs WHERE queue = %(queue)s AND status IN ('pending', 'in_progress')

-- name: flush
DELETE FROM conveyor_jobs WHERE queue = %(queue)s AND status = 'pending'

-- name: retry_failed
-- An operator retries failed jobs (one by id, or all of a queue): back to
-- pending now, with a fresh attempt budget and the final-failure claim
-- released, so a second final failure runs its hooks again. The error
-- stays until the job completes. Idle workers of the queues are woken.
WITH r AS (
    UPDATE conveyor_jobs
    SET status = 'pending', attempt = 0, available_at = now(), completed_at = NULL, final_failure_at = NULL,
        final_failure_delivery = NULL, started_delivery = NULL
    WHERE status = 'failed' AND (id = %(id)s OR (%(id)s::text IS NULL AND queue = %(queue)s))
    RETURNING queue, job_group
), held AS (
    -- A failed job's group may have been pruned (prune_groups keeps only groups with jobs to
    -- run): held or made again, as the enqueue does, so the retried jobs are claimed.
    SELECT w.queue, w.job_group, k.found
    FROM (SELECT DISTINCT queue, job_group FROM r WHERE job_group <> '' ORDER BY queue, job_group) w
    LEFT JOIN LATERAL (SELECT true AS found FROM conveyor_job_groups g
                       WHERE g.queue = w.queue AND g.job_group = w.job_group
                       FOR KEY SHARE) k ON true
), groups AS (
    INSERT INTO conveyor_job_groups (queue, job_group)
    SELECT queue, job_group FROM held WHERE found IS NULL ORDER BY queue, job_group
    ON CONFLICT (queue, job_group) DO UPDATE SET last_served = conveyor_job_groups.last_served WHERE false
), woke AS (
    SELECT pg_notify(%(channel)s, q.queue) FROM (SELECT DISTINCT queue FROM r) q
)
SELECT count(*), (SELECT count(*) FROM woke) FROM r

-- name: delete_job
-- An operator deletes a job that no worker holds; its key goes with it.
DELETE FROM conveyor_jobs WHERE id = %(id)s AND status <> 'in_progress' RETURNING id

-- name: promote_job
-- An operator runs a delayed job now: a pending row not yet due is due at
-- once, on the server's clock, and its queue's idle workers are woken. No
-- worker holds a pending row, so there is no other copy to fence off; a
-- row that turned due, was claimed or deleted meanwhile matches nothing.
WITH p AS (
    UPDATE conveyor_jobs SET available_at = now(), wait_event = NULL
    WHERE id = %(id)s AND status = 'pending' AND available_at > now()
    RETURNING queue
), woke AS (
    SELECT pg_notify(%(channel)s, p.queue) FROM p
)
SELECT count(*), (SELECT count(*) FROM woke) FROM p

-- name: cancel_job
-- An operator or the API cancels a job. A pending one (waiting or delayed:
-- no worker holds it) ends cancelled at once and never starts. One a worker
-- holds keeps its row held; the cancellation is stored on it and its holder
-- is woken (NOTIFY on the cancel channel, payload the id), ends the run and
-- writes the fenced outcome (cancel_outcome); a holder that has not started
-- it ends it at its start. Returns the status the job had (no row: unknown);
-- 'failed' for one whose final failure was claimed: its end is decided and its
-- hooks still run to their end (in a finalize delivery, pending again, when
-- their worker died), so it is never cancelled.
WITH j AS (
    SELECT id, CASE WHEN final_failure_at IS NULL THEN status ELSE 'failed' END AS status
    FROM conveyor_jobs WHERE id = %(id)s FOR UPDATE
), ended AS (
    UPDATE conveyor_jobs c
    SET status = 'cancelled', completed_at = now(), cancel_requested_at = now(), wait_event = NULL
    FROM j WHERE c.id = j.id AND j.status = 'pending'
    RETURNING c.id
), asked AS (
    UPDATE conveyor_jobs c
    SET cancel_requested_at = coalesce(c.cancel_requested_at, now())
    FROM j WHERE c.id = j.id AND j.status = 'in_progress'
    RETURNING c.id
), woke AS (
    SELECT pg_notify(%(channel)s, asked.id) FROM asked
)
SELECT j.status, (SELECT count(*) FROM ended), (SELECT count(*) FROM woke) FROM j

-- name: cancel_outcome
-- The current delivery of a job whose cancellation was asked ends it
-- cancelled (after its cancel hook). Fenced like an ack: a superseded
-- delivery matches no row, and once cancelled no late ack, nack or retry
-- (they need in_progress) can change the row.
UPDATE conveyor_jobs
SET status = 'cancelled', completed_at = now(), worker_id = NULL, error = coalesce(%(error)s, error)
WHERE id = %(id)s AND delivery = %(delivery)s AND status = 'in_progress' AND cancel_requested_at IS NOT NULL
RETURNING id

-- name: cancel_requested
-- Of these held jobs, those whose cancellation was asked (a worker's check
-- behind the wake-up, in case a notification was lost).
SELECT id FROM conveyor_jobs
WHERE id = ANY(%(ids)s::text[]) AND status = 'in_progress' AND cancel_requested_at IS NOT NULL

-- name: listen_cancel
LISTEN conveyor_cancel

-- name: set_group_weight
-- A named group's weight (migration 0077): its row made if need be, and the
-- queue's default group '' with it (a queue with a group row is claimed by
-- claim_groups, whose rotation must hold the default group too, as enqueue
-- makes it). A group made here starts at pass 0: the claim starts it at
-- the queue's virtual time. Returns the weight stored.
WITH rotation AS (
    INSERT INTO conveyor_job_groups (queue, job_group) VALUES (%(queue)s, '')
    ON CONFLICT DO NOTHING
)
INSERT INTO conveyor_job_groups (queue, job_group, weight) VALUES (%(queue)s, %(group)s, %(weight)s)
ON CONFLICT (queue, job_group) DO UPDATE SET weight = excluded.weight
RETURNING weight

-- name: group_weights
-- The weights stored for a queue's named groups other than 1.
SELECT job_group, weight FROM conveyor_job_groups
WHERE queue = %(queue)s AND job_group <> '' AND weight <> 1
ORDER BY job_group
