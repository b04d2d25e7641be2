-- conveyor's Redis commands, one script so every state change is atomic.
--
-- The queue layout is Dramatiq's (dispatch.lua), so Dramatiq's own tools
-- still read it:
--   $ns:$queue            list of redis message ids (rid), FIFO
--   $ns:$queue.msgs       hash rid -> encoded message
--   $ns:$queue.XQ(.msgs)  dead letters, scored by when they died
--   $ns:__acks__.$worker.$queue   rids fetched by a worker, not yet acked
--   $ns:__heartbeats__    zset worker -> last heartbeat (ms)
-- conveyor adds job records (one per job id, surviving retries):
--   $ns:job:$id           hash: queue job state rid attempts key payload
--                         enqueued_at started_at finished_at error
--   $ns:idx:$queue:$state zset of job ids by when they entered the state
--   $ns:totals:$queue     hash completed / failed, never reset
--   $ns:dedup:$key        job id that holds the key, with a TTL
--   $ns:paused            set of paused queue names
--   $ns:deleted:$id       tombstone of a deleted job (TTL: the retention),
--                         so a worker holding its message never revives it
--   $ns:wake:$queue       a short list idle consumers block on (BLPOP), so a
--                         new message starts in milliseconds, not a poll later
--
-- ARGV: command, now_ms, queue, worker_id, then the command's arguments.

local ns = KEYS[1]
local command = ARGV[1]
local now = tonumber(ARGV[2])
local queue = ARGV[3]
local worker = ARGV[4]

local canonical = queue
local is_delay_queue = false
if string.sub(queue, -3) == ".DQ" then
    canonical = string.sub(queue, 1, -4)
    is_delay_queue = true
end

local queue_key = ns .. ":" .. queue
local messages_key = queue_key .. ".msgs"
local xqueue_key = ns .. ":" .. canonical .. ".XQ"
local xmessages_key = xqueue_key .. ".msgs"
local heartbeats_key = ns .. ":__heartbeats__"
local acks_key = ns .. ":__acks__." .. worker .. "." .. queue
local totals_key = ns .. ":totals:" .. canonical

-- Every state a record can be in (a deleted job leaves all their indexes).
local STATES = {"waiting", "delayed", "active", "completed", "failed"}

local function job_key(id)
    return ns .. ":job:" .. id
end

local function index_key(state)
    return ns .. ":idx:" .. canonical .. ":" .. state
end

-- Move a job record to a state, keeping exactly one index entry for it,
-- and set any further fields ({name, value, ...}) in the same write.
-- Every state change goes through here, so the record's "state" names the
-- one index that holds the job: only that entry is removed (one ZREM, not
-- one per state: this runs at every enqueue, start and ack).
local function set_state(id, state, fields)
    local record = job_key(id)
    local previous = redis.call("hget", record, "state")
    if previous and previous ~= state then
        redis.call("zrem", index_key(previous), id)
    end
    redis.call("zadd", index_key(state), now, id)
    redis.call("hset", record, "state", state, "updated_at", now, unpack(fields or {}))
end

-- True when the job record still points at this delivery: an older
-- delivery (acked after its retry was enqueued) must not move the record.
local function is_current(id, rid)
    return redis.call("hget", job_key(id), "rid") == rid
end

local function heartbeat()
    redis.call("zadd", heartbeats_key, now, worker)
end

local function dead_letter(rid, data)
    redis.call("zadd", xqueue_key, now, rid)
    redis.call("hset", xmessages_key, rid, data)
    redis.call("hdel", messages_key, rid)
end

-- A failed job of this queue goes back to the tail of the queue with a
-- fresh attempt budget and its final-failure claim released; its message
-- comes back from the dead letters (or from the record's copy).
local function retry_one(id)
    local record = job_key(id)
    if redis.call("hget", record, "state") ~= "failed" or redis.call("hget", record, "queue") ~= canonical then
        return false
    end
    local rid = redis.call("hget", record, "rid")
    local data = redis.call("hget", xmessages_key, rid) or redis.call("hget", record, "payload")
    if not data then
        return false
    end
    redis.call("zrem", xqueue_key, rid)
    redis.call("hdel", xmessages_key, rid)
    redis.call("hset", messages_key, rid, data)
    redis.call("rpush", queue_key, rid)
    redis.call("lpush", ns .. ":wake:" .. canonical, 1)
    redis.call("ltrim", ns .. ":wake:" .. canonical, 0, 63)
    redis.call("hset", record, "attempts", 0)
    redis.call("hdel", record, "final_failure", "finished_at", "eta")
    redis.call("persist", record)
    set_state(id, "waiting")
    return true
end

-- The delivery is done: drop the message; a current record becomes completed.
-- A delay-queue ack only means the message moved on to its queue.
local function ack_one(rid, id, retention)
    if redis.call("srem", acks_key, rid) > 0 then
        redis.call("hdel", messages_key, rid)
    end
    if not is_delay_queue and is_current(id, rid) then
        set_state(id, "completed", {"finished_at", now})
        redis.call("hdel", job_key(id), "error")
        redis.call("pexpire", job_key(id), retention)
        redis.call("hincrby", totals_key, "completed", 1)
    end
end

-- Acks buffered by the worker ride along with its next call:
-- ARGV[first] = retention_ms, ARGV[first + 1] = count, then rid, id pairs.
local function ack_buffered(first)
    local retention, count = ARGV[first], tonumber(ARGV[first + 1])
    for i = 0, count - 1 do
        ack_one(ARGV[first + 2 + 2 * i], ARGV[first + 3 + 2 * i], retention)
    end
end

-- enqueue(rid, id, data, job, key, dedup_ttl_ms, eta_ms, error)
-- Returns {id, deduplicated}. With a key, the key is taken and the
-- message pushed in one step, so a crash can never leave a reserved key
-- without its job; a key whose job record is gone is free again.
if command == "enqueue" then
    local rid, id, data, job, key = ARGV[5], ARGV[6], ARGV[7], ARGV[8], ARGV[9]
    local dedup_ttl, eta, err = ARGV[10], ARGV[11], ARGV[12]
    -- A deleted job's message may still come back (a worker held it until
    -- its delay passed): drop it instead of bringing the job back.
    if redis.call("exists", ns .. ":deleted:" .. id) == 1 then
        return {id, 0}
    end
    if key ~= "" then
        local dedup_key = ns .. ":dedup:" .. key
        local holder = redis.call("get", dedup_key)
        if holder and redis.call("exists", job_key(holder)) == 1 then
            return {holder, 1}
        end
        redis.call("set", dedup_key, id, "PX", dedup_ttl)
    end
    redis.call("hset", messages_key, rid, data)
    redis.call("rpush", queue_key, rid)
    -- Wake one idle consumer; the list is capped so nobody waiting is harmless.
    local wake_key = ns .. ":wake:" .. queue
    redis.call("lpush", wake_key, 1)
    redis.call("ltrim", wake_key, 0, 63)
    local record = job_key(id)
    redis.call("hsetnx", record, "enqueued_at", now)
    redis.call("hsetnx", record, "attempts", 0)
    redis.call("hset", record, "queue", canonical, "job", job, "rid", rid, "payload", data)
    if key ~= "" then
        redis.call("hset", record, "key", key)
    end
    if err ~= "" then
        redis.call("hset", record, "error", err)
    end
    redis.call("persist", record)
    if is_delay_queue then
        set_state(id, "delayed")
        redis.call("hset", record, "eta", eta)
    else
        set_state(id, "waiting")
    end
    return {id, 0}

-- fetch(count) -> {rid, data, rid, data, ...}; nothing from a paused queue.
elseif command == "fetch" then
    heartbeat()
    if redis.call("sismember", ns .. ":paused", canonical) == 1 then
        return {}
    end
    local out = {}
    for _ = 1, tonumber(ARGV[5]) do
        local rid = redis.call("lpop", queue_key)
        if not rid then
            break
        end
        local data = redis.call("hget", messages_key, rid)
        if data then
            redis.call("sadd", acks_key, rid)
            table.insert(out, rid)
            table.insert(out, data)
        end
    end
    return out

-- start(rid, id, retention_ms, n, buffered acks...) -> attempt number,
-- counting every start of the job, including those whose worker died.
-- 0 when the job was deleted.
elseif command == "start" then
    heartbeat()
    ack_buffered(7)
    local rid, id = ARGV[5], ARGV[6]
    if not is_current(id, rid) then
        return 0
    end
    local attempt = redis.call("hincrby", job_key(id), "attempts", 1)
    set_state(id, "active", {"started_at", now, "worker", worker})
    return attempt

-- acks(retention_ms, n, rid, id, ...): buffered acks with no start to ride on.
elseif command == "acks" then
    heartbeat()
    ack_buffered(5)
    return 1

-- ack(rid, id, retention_ms): one delivery done, at once (delay queues).
elseif command == "ack" then
    heartbeat()
    ack_one(ARGV[5], ARGV[6], ARGV[7])
    return 1

-- nack(rid, id, retention_ms, error): the job failed for good.
elseif command == "nack" then
    heartbeat()
    local rid, id, retention, err = ARGV[5], ARGV[6], ARGV[7], ARGV[8]
    if redis.call("srem", acks_key, rid) > 0 then
        local data = redis.call("hget", messages_key, rid)
        if data then
            dead_letter(rid, data)
        end
    end
    if is_current(id, rid) then
        set_state(id, "failed", {"finished_at", now, "error", err})
        redis.call("pexpire", job_key(id), retention)
        redis.call("hincrby", totals_key, "failed", 1)
    end
    return 1

-- poison(rid, error): a message that cannot even be decoded goes to the
-- dead letters alone; the consumer carries on with the rest.
elseif command == "poison" then
    local rid = ARGV[5]
    redis.call("srem", acks_key, rid)
    local data = redis.call("hget", messages_key, rid)
    if data then
        dead_letter(rid, data)
    end
    redis.call("hincrby", totals_key, "failed", 1)
    return 1

-- requeue(rid...): prefetched messages a stopping worker never started.
elseif command == "requeue" then
    heartbeat()
    for i = 5, #ARGV do
        local rid = ARGV[i]
        if redis.call("srem", acks_key, rid) > 0 and redis.call("hexists", messages_key, rid) == 1 then
            redis.call("lpush", queue_key, rid)
        end
    end
    return 1

-- maintain(heartbeat_timeout_ms, retention_ms, dead_message_ttl_ms) -> ids of recovered jobs.
-- Messages held by workers whose heartbeat is older than the timeout go
-- back to the front of their queue; finished records leave the indexes
-- after the retention. Safe to run from every worker at once.
elseif command == "maintain" then
    heartbeat()
    local timeout, retention, dead_ttl = tonumber(ARGV[5]), tonumber(ARGV[6]), tonumber(ARGV[7])
    local recovered = {}
    local dead_workers = redis.call("zrangebyscore", heartbeats_key, 0, now - timeout)
    for _, dead in ipairs(dead_workers) do
        local dead_acks = ns .. ":__acks__." .. dead .. "." .. queue
        for _, rid in ipairs(redis.call("smembers", dead_acks)) do
            local data = redis.call("hget", messages_key, rid)
            if data then
                redis.call("lpush", queue_key, rid)
                local ok, decoded = pcall(cjson.decode, data)
                local id = ok and type(decoded) == "table" and decoded["message_id"]
                table.insert(recovered, id or rid)
                if id and not is_delay_queue and is_current(id, rid) then
                    set_state(id, "waiting")
                end
            end
        end
        redis.call("del", dead_acks)
        if #redis.call("keys", ns .. ":__acks__." .. dead .. ".*") == 0 then
            redis.call("zrem", heartbeats_key, dead)
        end
    end
    for _, state in ipairs({"completed", "failed"}) do
        redis.call("zremrangebyscore", index_key(state), 0, now - retention)
    end
    local expired = redis.call("zrangebyscore", xqueue_key, 0, now - dead_ttl, "LIMIT", 0, 1000)
    for _, rid in ipairs(expired) do
        redis.call("zrem", xqueue_key, rid)
        redis.call("hdel", xmessages_key, rid)
    end
    return recovered

-- retry_failed(batch) -> {retried, looked_at}: up to `batch` jobs of the
-- queue's failed index go back to the queue (see retry_one). Index
-- entries whose record expired are dropped. The caller repeats while
-- looked_at == batch.
elseif command == "retry_failed" then
    local batch = tonumber(ARGV[5])
    local ids = redis.call("zrange", index_key("failed"), 0, batch - 1)
    local retried = 0
    for _, id in ipairs(ids) do
        if retry_one(id) then
            retried = retried + 1
        else
            redis.call("zrem", index_key("failed"), id)
        end
    end
    return {retried, #ids}

-- retry(id) -> 1 when the failed job went back to its queue, else 0.
elseif command == "retry" then
    return retry_one(ARGV[5]) and 1 or 0

-- delete(id, retention_ms) -> 1 when the job was removed, 0 when it is
-- unknown or running. Its message is taken out of whichever list holds it.
elseif command == "delete" then
    local id, retention = ARGV[5], tonumber(ARGV[6])
    local record = job_key(id)
    local state = redis.call("hget", record, "state")
    if not state or state == "active" or redis.call("hget", record, "queue") ~= canonical then
        return 0
    end
    local rid = redis.call("hget", record, "rid")
    if rid then
        local delay_key = ns .. ":" .. canonical .. ".DQ"
        for _, list in ipairs({queue_key, delay_key}) do
            redis.call("lrem", list, 0, rid)
            redis.call("hdel", list .. ".msgs", rid)
        end
        redis.call("zrem", xqueue_key, rid)
        redis.call("hdel", xmessages_key, rid)
    end
    for _, s in ipairs(STATES) do
        redis.call("zrem", index_key(s), id)
    end
    redis.call("del", record)
    redis.call("set", ns .. ":deleted:" .. id, now, "PX", retention)
    return 1
end

return redis.error_reply("unknown command " .. command)
