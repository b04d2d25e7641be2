-- A fleet-wide semaphore. KEYS[1]: its sorted set. ARGV[1]: command; ARGV[2]: lease in ms.
local key, command, span = KEYS[1], ARGV[1], tonumber(ARGV[2])
local t = redis.call("time")
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)

-- acquire(holder, limit) -> 1 when a slot was taken, 0 when all are held.
if command == "acquire" then
    local holder, limit = ARGV[3], tonumber(ARGV[4])
    redis.call("zremrangebyscore", key, "-inf", now)  -- holders whose lease ran out (dead workers)
    if redis.call("zcard", key) >= limit then
        return 0
    end
    redis.call("zadd", key, now + span, holder)
    redis.call("pexpire", key, span)
    return 1

-- renew(holder) -> 1 while the holder still has its slot.
elseif command == "renew" then
    local holder = ARGV[3]
    local expires = redis.call("zscore", key, holder)
    if not expires or tonumber(expires) <= now then
        return 0
    end
    redis.call("zadd", key, "XX", now + span, holder)
    redis.call("pexpire", key, span)
    return 1

elseif command == "release" then
    redis.call("zrem", key, ARGV[3])
    return 1
end

return redis.error_reply("unknown command " .. command)
