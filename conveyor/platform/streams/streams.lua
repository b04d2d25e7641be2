-- Append to a run's stream, idempotently. KEYS[1]: the stream.
-- ARGV: kind ("chunk" | "end"), seq (chunks only), data, ttl_ms.
-- Entry ids are "<seq>-0"; fields k (kind) and d (data).
-- Returns the seq written, or 0 when nothing was (seq already there, or the stream has ended).
local key = KEYS[1]
local kind, seq, data, ttl = ARGV[1], tonumber(ARGV[2]), ARGV[3], ARGV[4]

local last, ended = 0, false
local top = redis.call("xrevrange", key, "+", "-", "COUNT", 1)
if #top > 0 then
    last = tonumber(string.match(top[1][1], "^(%d+)-"))
    ended = top[1][2][2] == "end"
end
if ended then
    return 0
end
if kind == "end" then
    seq = last + 1
elseif seq <= last then
    return 0
end
redis.call("xadd", key, seq .. "-0", "k", kind, "d", data)
redis.call("pexpire", key, ttl)
return seq
