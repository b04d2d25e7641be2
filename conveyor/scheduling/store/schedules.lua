-- Compare-and-set of one managed schedule in the hash KEYS[1] (redis.py's set_paused):
-- ARGV[1] the name, ARGV[2] the value the caller read, ARGV[3] the value to write.
-- Returns 1 when written, 0 when there is no such schedule, -1 when it changed since it was read.
local held = redis.call('HGET', KEYS[1], ARGV[1])
if not held then return 0 end
if held ~= ARGV[2] then return -1 end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[3])
return 1
