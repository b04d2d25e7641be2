-- Fleet-wide limits. KEYS[1]: the semaphore's sorted set, or the rate limit's key prefix.
-- ARGV[1]: command; ARGV[2]: lease (semaphore) or window (rate limit) in ms.
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

-- hit(limit) -> 0 when allowed, else ms until the window ends (the hit is refused).
elseif command == "hit" then
    local limit = tonumber(ARGV[3])
    local index = math.floor(now / span)
    local counter = key .. ":" .. index
    local hits = redis.call("incr", counter)
    if hits == 1 then
        redis.call("pexpire", counter, span * 2)
    end
    if hits > limit then
        return (index + 1) * span - now
    end
    return 0
end

return redis.error_reply("unknown command " .. command)
