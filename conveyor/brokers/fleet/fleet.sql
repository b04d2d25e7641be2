-- Named queries of the Postgres fleet store (postgres_store.py); tables in
-- conveyor/schema/migrations/0045_fleet.sql.

-- name: beat
INSERT INTO conveyor_fleet_workers AS w (id, host, pid, queues, threads, version, in_flight, done, failed)
VALUES (%(id)s, %(host)s, %(pid)s, %(queues)s, %(threads)s, %(version)s, %(in_flight)s, %(done)s, %(failed)s)
ON CONFLICT (id) DO UPDATE
SET heartbeat_at = now(), queues = EXCLUDED.queues, threads = EXCLUDED.threads, in_flight = EXCLUDED.in_flight,
    done = EXCLUDED.done, failed = EXCLUDED.failed, gone_at = NULL, gone_reason = NULL

-- name: leave
UPDATE conveyor_fleet_workers
SET gone_at = now(), gone_reason = %(reason)s, in_flight = '{}', done = %(done)s, failed = %(failed)s
WHERE id = %(id)s

-- name: sweep
-- Silent workers are gone: their jobs are (or are about to be) recovered.
UPDATE conveyor_fleet_workers SET gone_at = now(), gone_reason = 'recovered', in_flight = '{}'
WHERE gone_at IS NULL AND heartbeat_at < now() - make_interval(secs => %(gone_after)s)

-- name: forget
DELETE FROM conveyor_fleet_workers WHERE heartbeat_at < now() - make_interval(secs => %(after)s)

-- name: workers
SELECT extract(epoch FROM now())::float8, id, host, pid, queues, threads, version,
       extract(epoch FROM started_at)::float8, extract(epoch FROM heartbeat_at)::float8, in_flight, done, failed,
       extract(epoch FROM gone_at)::float8, gone_reason
FROM conveyor_fleet_workers ORDER BY heartbeat_at DESC

-- name: now
SELECT extract(epoch FROM now())::float8

-- name: attempt_start
INSERT INTO conveyor_job_attempts (job_id, token, attempt, worker, started_at)
VALUES (%(job_id)s, %(token)s, %(attempt)s, %(worker)s, now() - make_interval(secs => %(age)s))
ON CONFLICT (job_id, token) DO UPDATE SET started_at = EXCLUDED.started_at

-- name: attempt_end
INSERT INTO conveyor_job_attempts AS a (job_id, token, attempt, worker, ended_at, outcome, error, traceback)
VALUES (%(job_id)s, %(token)s, %(attempt)s, %(worker)s, now() - make_interval(secs => %(age)s), %(outcome)s,
        %(error)s, %(traceback)s)
ON CONFLICT (job_id, token) DO UPDATE
SET ended_at = EXCLUDED.ended_at, outcome = EXCLUDED.outcome, error = EXCLUDED.error, traceback = EXCLUDED.traceback

-- name: attempt_full
-- A start and its end in one batch (the middleware merged them): one row version, not two.
INSERT INTO conveyor_job_attempts AS a (job_id, token, attempt, worker, started_at, ended_at, outcome, error,
                                        traceback)
VALUES (%(job_id)s, %(token)s, %(attempt)s, %(worker)s, now() - make_interval(secs => %(start_age)s),
        now() - make_interval(secs => %(age)s), %(outcome)s, %(error)s, %(traceback)s)
ON CONFLICT (job_id, token) DO UPDATE
SET started_at = EXCLUDED.started_at, ended_at = EXCLUDED.ended_at, outcome = EXCLUDED.outcome,
    error = EXCLUDED.error, traceback = EXCLUDED.traceback

-- name: attempts
SELECT attempt, worker, extract(epoch FROM started_at)::float8, extract(epoch FROM ended_at)::float8, outcome,
       error, traceback
FROM conveyor_job_attempts WHERE job_id = %(job_id)s
ORDER BY coalesce(started_at, ended_at), attempt

-- name: prune_attempts
-- A batch of attempts older than the retention (by their start, else their
-- end), found through conveyor_job_attempts_started: the rows with a start
-- by a range of it, the few without one by its NULL entries. A filter on
-- coalesce(started_at, ended_at) cannot use the index and read the whole
-- table on every pass (bench/RESULTS-scale.md).
DELETE FROM conveyor_job_attempts WHERE ctid IN (
    SELECT ctid FROM (
        (SELECT ctid FROM conveyor_job_attempts
         WHERE started_at < now() - make_interval(secs => %(retention)s) LIMIT %(limit)s)
        UNION ALL
        (SELECT ctid FROM conveyor_job_attempts
         WHERE started_at IS NULL AND ended_at < now() - make_interval(secs => %(retention)s) LIMIT %(limit)s)
    ) old LIMIT %(limit)s
)

-- name: enqueued_totals
SELECT queue, job, sum(enqueued)::bigint FROM conveyor_enqueue_totals GROUP BY queue, job

-- name: find_by_key
-- The broker's own key column (0010_jobs.sql): the job that holds the key.
SELECT id FROM conveyor_jobs WHERE job_key = %(key)s
