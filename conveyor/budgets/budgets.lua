-- Budgets: sliding-window logs, one sorted set per key (members "<weight>|<id>", scored by ms).
-- KEYS: the budgets' sets. ARGV[1]: "take" or "spend"; ARGV[2]: a unique id for the new members;
-- then per key: limit, window in ms, weight. Time is the server's (TIME), so hosts with skewed
-- clocks agree. take -> one wait in ms per key, all 0 when admitted (and recorded).
-- usage (a read; ARGV[3]: the window in ms) -> per key, the weight in its window now.
local command, id = ARGV[1], ARGV[2]
local t = redis.call("time")
local now = tonumber(t[1]) * 1000 + tonumber(t[2]) / 1000

local function admits(total, weight, limit)
    return total < limit and (total <= 0 or total + weight <= limit)
end

local function record(key, span, weight)
    if weight > 0 then
        redis.call("zadd", key, now, weight .. "|" .. id)
        redis.call("pexpire", key, math.ceil(span))
    end
end

if command == "usage" then
    local span, sums = tonumber(ARGV[3]), {}
    for i, key in ipairs(KEYS) do
        local total = 0
        for _, member in ipairs(redis.call("zrangebyscore", key, "(" .. (now - span), "+inf")) do
            total = total + tonumber(string.match(member, "^([^|]+)"))
        end
        sums[i] = tostring(total)
    end
    return sums
end

if command == "spend" then
    record(KEYS[1], tonumber(ARGV[4]), tonumber(ARGV[5]))
    return {0}
end

local waits, refused = {}, false
for i, key in ipairs(KEYS) do
    local limit, span, weight = tonumber(ARGV[3 * i]), tonumber(ARGV[3 * i + 1]), tonumber(ARGV[3 * i + 2])
    redis.call("zremrangebyscore", key, "-inf", now - span)
    local entries = redis.call("zrange", key, 0, -1, "WITHSCORES")
    local total = 0
    for j = 1, #entries, 2 do
        total = total + tonumber(string.match(entries[j], "^([^|]+)"))
    end
    local wait = 0
    if not admits(total, weight, limit) then
        refused = true
        wait = span
        for j = 1, #entries, 2 do
            total = total - tonumber(string.match(entries[j], "^([^|]+)"))
            if admits(total, weight, limit) then
                wait = math.max(tonumber(entries[j + 1]) + span - now, 1)
                break
            end
        end
    end
    waits[i] = tostring(wait)
end
if not refused then
    for i, key in ipairs(KEYS) do
        record(key, tonumber(ARGV[3 * i + 1]), tonumber(ARGV[3 * i + 2]))
    end
end
return waits
