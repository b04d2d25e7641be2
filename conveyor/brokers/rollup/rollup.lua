-- The dashboard's per-minute rollup on Redis (conveyor/brokers/rollup/redis_store.py).
-- Beside the broker's keys, never touching them:
--
--   $ns:rollup:$queue:$minute   hash, expires a day after its minute (UNIX s, a multiple of 60):
--                                 "$job\31enqueued|completed|failed|retried" -> count
--                                 "$job\31w$i" / "$job\31r$i"                -> wait / run bucket i count
--                                 "\31depth"                                 -> waiting jobs, last sample
--   $ns:rollup:queues           set of the queues that have rows
--   $ns:rollup:flush:$id        a flush already added (refuses a retried one); expires
--
-- KEYS[1] is the namespace; ARGV[1] the command. Minutes come from TIME:
-- every worker host is dated by this server's clock.

local ns = KEYS[1]
local command = ARGV[1]
local t = redis.call("TIME")
local now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)

local function minute_key(queue, at_ms)
    local minute = math.floor(at_ms / 60000) * 60
    return ns .. ":rollup:" .. queue .. ":" .. minute, minute
end

-- add(flush_id, keep_ms, flush_keep_ms, groups, [queue, job, age_ms, nfields, field, n, ...]...)
if command == "add" then
    local flush_key = ns .. ":rollup:flush:" .. ARGV[2]
    if not redis.call("set", flush_key, 1, "NX", "PX", tonumber(ARGV[4])) then
        return 0
    end
    local keep = tonumber(ARGV[3])
    local i = 6
    for _ = 1, tonumber(ARGV[5]) do
        local queue, job, age, nfields = ARGV[i], ARGV[i + 1], tonumber(ARGV[i + 2]), tonumber(ARGV[i + 3])
        i = i + 4
        local key, minute = minute_key(queue, now_ms - age)
        for _ = 1, nfields do
            redis.call("hincrby", key, job .. "\31" .. ARGV[i], tonumber(ARGV[i + 1]))
            i = i + 2
        end
        redis.call("pexpireat", key, minute * 1000 + keep)
        redis.call("sadd", ns .. ":rollup:queues", queue)
    end
    return 1
end

-- depth(keep_ms, [queue, n]...): each queue's waiting jobs in the current minute.
if command == "depth" then
    local keep = tonumber(ARGV[2])
    for i = 3, #ARGV, 2 do
        local key, minute = minute_key(ARGV[i], now_ms)
        redis.call("hset", key, "\31depth", ARGV[i + 1])
        redis.call("pexpireat", key, minute * 1000 + keep)
        redis.call("sadd", ns .. ":rollup:queues", ARGV[i])
    end
    return 1
end

return redis.error_reply("unknown rollup command " .. tostring(command))
