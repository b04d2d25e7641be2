-- The worker registry and attempt history on Redis (conveyor/brokers/fleet/redis_store.py).
-- Beside the broker's keys, never touching them:
--
--   $ns:fleet:workers         zset worker id -> last heartbeat (ms, this server's clock)
--   $ns:fleet:worker:$id      hash host, pid, queues, threads, version, started_at,
--                             heartbeat_at, in_flight, done, failed, gone_at, gone_reason
--   $ns:attempts:$job_id      hash token -> JSON {attempt, worker, started_at, ended_at,
--                             outcome, error, traceback}; expires with the job's retention
--   $ns:fleet:enqueued        hash "queue\31job" -> jobs enqueued, never reset (written by the
--                             broker's own enqueue script, redis/jobs.lua)
--
-- KEYS[1] is the namespace; ARGV[1] the command. Times come from TIME, so
-- every worker host is dated by one clock.

local ns = KEYS[1]
local command = ARGV[1]
local t = redis.call("TIME")
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local workers_key = ns .. ":fleet:workers"

local function worker_key(id)
    return ns .. ":fleet:worker:" .. id
end

-- beat(id, keep_ms, field, value, ...): register or refresh a worker.
if command == "beat" then
    local id, keep = ARGV[2], tonumber(ARGV[3])
    local key = worker_key(id)
    if redis.call("hexists", key, "started_at") == 0 then
        redis.call("hset", key, "started_at", now)
    end
    redis.call("hdel", key, "gone_at", "gone_reason")
    redis.call("hset", key, "heartbeat_at", now, unpack(ARGV, 4))
    redis.call("pexpire", key, keep)
    redis.call("zadd", workers_key, now, id)
    return now
end

-- leave(id, reason, field, value, ...): a worker stops cleanly.
if command == "leave" then
    local key = worker_key(ARGV[2])
    if redis.call("exists", key) == 1 then
        redis.call("hset", key, "gone_at", now, "gone_reason", ARGV[3], unpack(ARGV, 4))
    end
    return now
end

-- sweep(gone_after_ms, forget_after_ms) -> how many were marked gone now.
if command == "sweep" then
    local gone_after, forget_after = tonumber(ARGV[2]), tonumber(ARGV[3])
    redis.call("zremrangebyscore", workers_key, 0, now - forget_after)
    local marked = 0
    for _, id in ipairs(redis.call("zrangebyscore", workers_key, 0, now - gone_after)) do
        local key = worker_key(id)
        if redis.call("exists", key) == 0 then
            redis.call("zrem", workers_key, id)
        elseif redis.call("hexists", key, "gone_at") == 0 then
            redis.call("hset", key, "gone_at", now, "gone_reason", "recovered", "in_flight", "[]")
            marked = marked + 1
        end
    end
    return marked
end

-- attempts(keep_ms, n, [kind, job_id, token, attempt, worker, age_ms, outcome, error, traceback,
--                        start_age_ms] * n)
-- kind: start, end (merged into its start's entry), or full (both at once: no read).
if command == "attempts" then
    local keep, n = tonumber(ARGV[2]), tonumber(ARGV[3])
    for i = 0, n - 1 do
        local b = 4 + i * 10
        local kind, job_id, token = ARGV[b], ARGV[b + 1], ARGV[b + 2]
        local at = now - tonumber(ARGV[b + 5])
        local key = ns .. ":attempts:" .. job_id
        local entry = {}
        if kind == "end" then
            local raw = redis.call("hget", key, token)
            if raw then entry = cjson.decode(raw) end
        end
        entry.attempt = tonumber(ARGV[b + 3])
        entry.worker = ARGV[b + 4]
        if kind == "start" then
            entry.started_at = at
        else
            if kind == "full" then entry.started_at = now - tonumber(ARGV[b + 9]) end
            entry.ended_at = at
            entry.outcome = ARGV[b + 6]
            if ARGV[b + 7] ~= "" then entry.error = ARGV[b + 7] end
            if ARGV[b + 8] ~= "" then entry.traceback = ARGV[b + 8] end
        end
        redis.call("hset", key, token, cjson.encode(entry))
        redis.call("pexpire", key, keep)
    end
    return n
end

return redis.error_reply("unknown fleet command " .. tostring(command))
