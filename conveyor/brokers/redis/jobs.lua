-- conveyor's Redis commands, one script so every state change is atomic.
--
-- Key names are those of keys.py (the Python side reads them there); the
-- queue layout is Dramatiq's, so Dramatiq's own tools still read it:
--   $ns:$queue            list of redis message ids (rid), FIFO: priority-0 jobs
--   $ns:$queue.p$p        the same for jobs of priority p (1..9), see ready_push
--   $ns:$queue.levels     set of the levels p > 0 that may hold rids
--   $ns:$queue.ranks      hash rid -> ready_at of the rids in those levels
--   $ns:$queue.msgs       hash rid -> encoded message
--   $ns:$queue.XQ(.msgs)  dead letters, scored by when they died
--   $ns:__acks__.$worker.$queue   rids fetched by a worker, not yet settled
--   $ns:__acksets__.$worker       queues in which that worker holds acks
--                                 (recovery reads this, never KEYS)
--   $ns:__heartbeats__    zset worker -> last heartbeat (server ms)
--   $ns:__maintained_at__ server ms of the last recovery pass
-- conveyor adds job records (one per job id, surviving retries):
--   $ns:job:$id           hash: queue job state rid delivery attempts key
--                         payload enqueued_at started_at finished_at error
--                         eta worker final_failure updated_at enqueued_rid
--                         priority ready_at
--   $ns:idx:$queue:$state zset of job ids by when they entered the state
--   $ns:totals:$queue     hash completed / failed, never reset
--   $ns:fleet:enqueued    hash "queue\31job" -> jobs enqueued (not a keyed
--                         duplicate, not a repeated call), never reset; the
--                         fleet registry reads it (one per queue on a cluster)
--   $ns:dedup:$key        job id that holds the key, with a TTL
--   $ns:deduplicated:$rid the job id an enqueued message (rid) was found a
--                         duplicate of, kept as long as that call may be
--                         repeated (its reply lost): the repeat answers the
--                         same, even once the key has expired
--   $ns:paused            set of paused queue names
--   $ns:deleted:$id       tombstone of a deleted job (TTL: the retention)
--   $ns:wake:$queue       a short list idle consumers block on (BLPOP)
-- fair shares per group (job record field `group`; none: the default group,
-- whose ready list is the queue's own list above):
--   $ns:gready:$queue:$group  ready rids of one named group, a sorted set
--                         scored by rank (priority with aging, see
--                         push_ready): the lowest is taken first
--   $ns:gstamp:$queue     the last ready stamp (server µs) given to a job of
--                         a named group of the queue: stamps only grow, so
--                         FIFO holds within a priority
--   $ns:group:$queue:$group  a named group's ready rids in the FIFO list of
--                         earlier releases: still drained first (fetch), never
--                         written any more
--   $ns:groups:$queue     ring (list) of the named groups with ready rids,
--                         plus "" for the default group; empty (absent)
--                         when no named group has a ready job, and fetch
--                         then pops the queue's list as it always did
--   $ns:gweights:$queue   hash group -> its weight, the turns it takes per
--                         round of the ring (absent: 1); a weight in the
--                         queue's settings comes with each fetch and wins
--   $ns:gturn:$queue      hash: the group at the ring's head -> the turns it
--                         has taken this round (it stays at the head until
--                         it has taken its weight's, then goes to the back)
--   $ns:running:$queue    hash group -> jobs of it held (active); a record
--                         holding one carries `slot` (its group), taken
--                         when it turns active and released by set_state
--                         when it leaves active, so every path frees it once
--   cancel channel        pub/sub channel (keys.py Keys.cancels, passed in
--                         ARGV): the id of a held job whose cancel was asked
--   $ns:cancel_answer:$call  what one cancel call answered, with a TTL: the
--                         same call repeated after a lost reply answers it
-- A record whose cancellation was asked while a worker held it carries
-- cancel_requested (server ms); its holder ends it (cancelled), and so does
-- any later start of it.
-- and the waits for events (conveyor/events.py):
--   $ns:event:$name       a kept signal's resolution, with a TTL (PX)
--   $ns:event_waiters:$name  set of job ids parked awaiting $name
--   job record fields: event (the name it awaits), resume (its message as
--   its queue takes it, without the eta), wait:$name (the resolution of
--   each wait, insert-first)
--
-- The fence. Every time a message is handed to a worker (fetch) or taken
-- back from one (hand-back, recovery), the record's `delivery` grows by
-- one. The worker carries the number it was given; start, ack, nack,
-- retry, promotion and the final-failure claim go through only while the
-- record still has that number (and that rid). A worker that was given up
-- on can therefore neither start nor settle the job's next delivery.
--
-- Time is the server's (TIME), never the caller's: heartbeats and the
-- dead-worker cutoff are on one clock however wrong a worker's clock is.
--
-- ARGV: command, queue, worker_id, then the command's arguments.

-- KEYS[1] is the scope every key below is built from: the namespace on a
-- plain Redis, the queue's `ns{queue}` on Redis Cluster (keys.py: one slot
-- per queue), so a new key must be built from `ns` too.
local ns = KEYS[1]
local command = ARGV[1]
local worker = ARGV[3]
local clock = redis.call("time")
-- Finished-job index entries past the retention removed by one maintenance pass, all indexes
-- together: ~10 ms of Redis; at one pass per worker process every maintenance interval (5 s)
-- that is 4,000 a second per process, above what one process drains.
local PRUNE_BATCH = 20000
local now = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)
local now_us = tonumber(clock[1]) * 1000000 + tonumber(clock[2])

local heartbeats_key = ns .. ":__heartbeats__"

-- Every state a record can be in (a deleted job leaves all their indexes).
local STATES = {"waiting", "delayed", "active", "completed", "failed", "cancelled"}
table.insert(STATES, "awaiting")  -- parked until a signal or its timeout (ctx.wait_for)

-- The keys of one queue (a delay queue is named $queue.DQ).
local function Q(name)
    local q = {name = name, canonical = name, delay = false}
    if string.sub(name, -3) == ".DQ" then
        q.canonical = string.sub(name, 1, -4)
        q.delay = true
    end
    q.list = ns .. ":" .. name
    q.msgs = q.list .. ".msgs"
    q.xq = ns .. ":" .. q.canonical .. ".XQ"
    q.xmsgs = q.xq .. ".msgs"
    q.totals = ns .. ":totals:" .. q.canonical
    q.wake = ns .. ":wake:" .. name
    return q
end

local queue = Q(ARGV[2])

local function job_key(id)
    return ns .. ":job:" .. id
end

local function acks_key(holder, q)
    return ns .. ":__acks__." .. holder .. "." .. q.name
end

local function acksets_key(holder)
    return ns .. ":__acksets__." .. holder
end

local function index_key(q, state)
    return ns .. ":idx:" .. q.canonical .. ":" .. state
end

local function wake(q)
    -- Wake one idle consumer; the list is capped so nobody waiting is harmless.
    redis.call("lpush", q.wake, 1)
    redis.call("ltrim", q.wake, 0, 63)
end

local function group_list(q, g)
    return ns .. ":group:" .. q.canonical .. ":" .. g
end

local function ring_key(q)
    return ns .. ":groups:" .. q.canonical
end

local function group_set(q, g)
    return ns .. ":gready:" .. q.canonical .. ":" .. g
end

-- A named group's next ready stamp (server µs, never below the last one
-- given in the queue, so two jobs of a script call or of a clock stepped
-- back still keep their order).
local stamps = {}
local function next_stamp(q)
    local key = ns .. ":gstamp:" .. q.canonical
    local last = stamps[key] or tonumber(redis.call("get", key) or "") or 0
    local stamp = math.max(now_us, last + 1)
    stamps[key] = stamp
    redis.call("set", key, string.format("%.0f", stamp))
    return stamp
end

local function weights_key(q)
    return ns .. ":gweights:" .. q.canonical
end

local function turn_key(q)
    return ns .. ":gturn:" .. q.canonical
end

local function running_key(q)
    return ns .. ":running:" .. q.canonical
end

-- A ring left with only the default group's turn is no ring: plain fetch again.
local function tidy_ring(q)
    local ring = ring_key(q)
    if redis.call("llen", ring) == 1 and redis.call("lindex", ring, 0) == "" then
        redis.call("del", ring)
    end
end

-- A record field the caller has read already (`known`: field -> value, false when absent, as HMGET
-- gives it), else read now.
local function field_of(known, id, name)
    if known and known[name] ~= nil then
        return known[name]
    end
    return redis.call("hget", job_key(id), name)
end

-- A held job of a named group takes one of its group's slots (once).
local function take_slot(q, id, known)
    local record = job_key(id)
    local g = field_of(known, id, "group")
    if g and g ~= "" and not field_of(known, id, "slot") then
        redis.call("hincrby", running_key(q), g, 1)
        redis.call("hset", record, "slot", g)
    end
end

-- The slot a record holds goes back to its group, exactly once.
local function release_slot(q, id, known)
    local record = job_key(id)
    local g = field_of(known, id, "slot")
    if g then
        redis.call("hdel", record, "slot")
        if redis.call("hincrby", running_key(q), g, -1) <= 0 then
            redis.call("hdel", running_key(q), g)
        end
    end
end

-- Move a job record to a state, keeping exactly one index entry for it,
-- and set any further fields ({name, value, ...}) in the same write.
-- Turning active takes its group's slot; leaving active releases it.
-- known: the record's state, group and slot as the caller read them in
-- this call (field_of), so they are not read twice.
local function set_state(q, id, state, fields, known)
    local record = job_key(id)
    if state == "active" then
        take_slot(q, id, known)
    else
        release_slot(q, id, known)
    end
    local previous = field_of(known, id, "state")
    if previous and previous ~= state then
        redis.call("zrem", index_key(q, previous), id)
    end
    redis.call("zadd", index_key(q, state), now, id)
    redis.call("hset", record, "state", state, "updated_at", now, unpack(fields or {}))
end

local function event_key(name)
    return ns .. ":event:" .. name
end

local function event_waiters_key(name)
    return ns .. ":event_waiters:" .. name
end

-- A job leaves `awaiting` (promoted at its timeout, by an operator or a
-- signal): it is no longer among its event's waiters.
local function forget_wait(id)
    local record = job_key(id)
    local ev = redis.call("hget", record, "event")
    if ev then
        redis.call("srem", event_waiters_key(ev), id)
        redis.call("hdel", record, "event", "resume")
    end
end

local function heartbeat()
    redis.call("zadd", heartbeats_key, now, worker)
end

-- The job id inside an encoded message, and its actor's name; nil when
-- neither can be read. Read from the text, not with cjson (which refuses
-- the lone surrogates JSON may carry in an error text, and costs a parse
-- per message): Dramatiq's encoding puts the top-level message_id after
-- args, kwargs and options, so it is the last unescaped occurrence (a
-- payload may have a key of that name too); actor_name comes before args.
local function message_id(data)
    local id = nil
    for found in string.gmatch(data, '"message_id":"([^"\\]*)"') do
        id = found
    end
    if id and id ~= "" then
        return id, string.match(data, '"actor_name":"([^"\\]*)"')
    end
    local ok, decoded = pcall(cjson.decode, data)
    if ok and type(decoded) == "table" and type(decoded["message_id"]) == "string" then
        return decoded["message_id"], decoded["actor_name"]
    end
    return nil, nil
end

-- Priorities (0..9, higher first) and aging. A job of priority 0 waits
-- in Dramatiq's FIFO list, so the plain path is as before; one of priority
-- p > 0 waits in its level's list ($queue.p$p), and $queue.levels names the
-- levels that may hold any. The record keeps `priority` and `ready_at`
-- (server ms it last became ready; a hand-back keeps it). Its rank is
-- ready_at - p x aging_ms, and fetch takes the lowest rank among the
-- levels' heads (on a tie the higher level): a job overtakes lower ones
-- that became ready at most p x aging earlier, never more (no starvation).
-- A delay queue ($queue.DQ) has no levels: its jobs land in theirs when
-- they are promoted.
local MAX_PRIORITY = 9

local function level_list(q, p)
    if p == 0 then
        return q.list
    end
    return q.list .. ".p" .. p
end

local function levels_key(q)
    return q.list .. ".levels"
end

-- ready_at of each rid waiting in a level above 0, so a head's rank is one
-- read (a priority-0 head's comes from its record).
local function ranks_key(q)
    return q.list .. ".ranks"
end

local function priority_of(id)
    local p = tonumber(redis.call("hget", job_key(id), "priority") or "") or 0
    return math.max(0, math.min(MAX_PRIORITY, p))
end

-- A ready message enters its level: at the tail, ready now; or handed back
-- (front), at the head with the ready_at it had, so it keeps its place.
local function ready_push(q, rid, id, front)
    local p = 0
    -- No record (deleted, not adopted yet): nothing to write, or a key would be left behind without a TTL.
    if id and not q.delay and redis.call("exists", job_key(id)) == 1 then
        p = priority_of(id)
        if not front or not redis.call("hget", job_key(id), "ready_at") then
            redis.call("hset", job_key(id), "ready_at", now)
        end
    end
    if p > 0 then
        redis.call("sadd", levels_key(q), p)
        redis.call("hset", ranks_key(q), rid, redis.call("hget", job_key(id), "ready_at"))
    end
    redis.call(front and "lpush" or "rpush", level_list(q, p), rid)
end

-- A ready message leaves its queue (deleted, cancelled) whatever its level.
local function ready_remove(q, rid, id)
    redis.call("lrem", q.list, 0, rid)
    local p = (id and not q.delay) and priority_of(id) or 0
    if p > 0 then
        redis.call("lrem", level_list(q, p), 0, rid)
        redis.call("hdel", ranks_key(q), rid)
    end
end

-- A ready message enters its job's group (the queue's own lists for the
-- default group, a delay queue or no record: by priority, ready_push), at
-- the back or, handed back, the front; a named group that had no ready
-- job joins the ring.
-- A named group's jobs are a sorted set scored by rank, in µs: the job's
-- ready stamp (next_stamp) minus its lead, priority x aging, which its
-- enqueue stored on the record (`lead`, ms: the producer's aging, as on
-- Postgres). The rank is kept on the record (`grank`), so a job handed
-- back goes back to its place; one without (fetched from an earlier
-- release's list) goes back to that list's front, or before the set's first.
local function push_ready(q, id, rid, front)
    local r = (not q.delay) and id and redis.call("hmget", job_key(id), "group", "priority", "lead", "grank")
    local g = r and r[1]
    if g and g ~= "" then
        local set, list = group_set(q, g), group_list(q, g)
        local score = front and tonumber(r[4] or "")
        if front and not score and redis.call("exists", list) == 1 then
            redis.call("lpush", list, rid) -- from an earlier release's list, which runs first: to its front
            wake(q)
            return
        end
        if not score then
            if front then
                local head = redis.call("zrange", set, 0, 0, "WITHSCORES")
                score = (tonumber(head[2] or "") or now_us) - 1
                redis.call("hset", job_key(id), "grank", string.format("%.0f", score))
            else
                local p = math.max(0, math.min(MAX_PRIORITY, tonumber(r[2] or "") or 0))
                local lead = tonumber(r[3] or "") or p * 60000
                score = next_stamp(q) - lead * 1000
                redis.call("hset", job_key(id), "grank", string.format("%.0f", score), "ready_at", now)
            end
        end
        redis.call("zadd", set, score, rid)
        if redis.call("zcard", set) == 1 and redis.call("exists", list) == 0 then
            local ring = ring_key(q)
            if redis.call("llen", ring) == 0 then
                redis.call("rpush", ring, "")
            end
            redis.call(front and "lpush" or "rpush", ring, g)
        end
    else
        ready_push(q, rid, id, front) -- the default group: its priority level
    end
    wake(q)
end

-- A message leaves the ready lists of its job (deleted, cancelled).
local function unready(q, id, rid)
    ready_remove(q, rid, id)
    local g = redis.call("hget", job_key(id), "group")
    if g and g ~= "" and not q.delay then
        local list, set = group_list(q, g), group_set(q, g)
        redis.call("zrem", set, rid)
        redis.call("lrem", list, 0, rid)
        if redis.call("zcard", set) == 0 and redis.call("llen", list) == 0 then
            redis.call("lrem", ring_key(q), 0, g)
            redis.call("hdel", turn_key(q), g)
            tidy_ring(q)
        end
    end
end

-- The rank of a level's head; nil when the level is empty. A head without
-- a record (a plain Dramatiq producer's message: fetch adopts it) ranks by
-- the time its producer stamped on it (the client's clock, all there is),
-- so it waits behind higher priorities as a job enqueued then would; one
-- with neither (undecodable, stale) ranks first: fetch deals with it as it
-- did in the plain list.
local function head_rank(q, p, aging)
    local rid = redis.call("lindex", level_list(q, p), 0)
    if not rid then
        return nil
    end
    if p > 0 then
        local ready = tonumber(redis.call("hget", ranks_key(q), rid) or "")
        if ready then
            return ready - p * aging
        end
    end
    local data = redis.call("hget", q.msgs, rid)
    local id = data and message_id(data)
    local ready = id and tonumber(redis.call("hget", job_key(id), "ready_at") or "")
    if not ready and data then
        ready = tonumber(string.match(data, '"message_timestamp":%s*(%d+)') or "")
    end
    if not ready then
        return -math.huge
    end
    return ready - p * aging
end

-- One fetch's view of the levels' heads (level -> rank, false when empty);
-- nil when no level above 0 holds anything: then the plain FIFO list alone.
local function ready_heads(q, aging)
    if q.delay then
        return nil
    end
    local levels = redis.call("smembers", levels_key(q))
    if #levels == 0 then
        return nil
    end
    local heads = {[0] = head_rank(q, 0, aging) or false}
    for _, level in ipairs(levels) do
        local p = tonumber(level)
        heads[p] = head_rank(q, p, aging) or false
        if not heads[p] then
            redis.call("srem", levels_key(q), level)
        end
    end
    return heads
end

-- The next ready rid: the lowest-ranked head (see ready_heads); nil when none.
local function ready_pop(q, aging, heads)
    if not heads then
        return redis.call("lpop", q.list)
    end
    local best = nil
    for p = MAX_PRIORITY, 0, -1 do
        local r = heads[p]
        if r and (best == nil or r < heads[best]) then
            best = p
        end
    end
    if best == nil then
        return nil
    end
    local rid = redis.call("lpop", level_list(q, best))
    if best > 0 then
        redis.call("hdel", ranks_key(q), rid)
    end
    heads[best] = head_rank(q, best, aging) or false
    if best > 0 and not heads[best] then
        redis.call("srem", levels_key(q), best)
    end
    return rid
end

-- 1 when the record still points at this message and this delivery;
-- 0 when the record is gone (deleted, expired); -1 when superseded.
-- Also returns the record's rid, delivery and any further fields asked
-- for, read in the same HMGET (false where absent).
local function fence(id, rid, delivery, ...)
    local r = redis.call("hmget", job_key(id), "rid", "delivery", ...)
    if not r[1] then
        return 0, r
    end
    if r[1] == rid and tostring(r[2]) == tostring(delivery) then
        return 1, r
    end
    return -1, r
end

-- The job whose record holds `rid` among those waiting in q (delayed or
-- awaiting, in a delay queue): for a message whose own id cannot be read,
-- so only rid and record tie it to its job. Oldest first: the message has
-- just left the head of its queue, so the scan ends early; nil if none.
local function job_of_rid(q, rid)
    local states = q.delay and {"delayed", "awaiting"} or {"waiting"}
    for _, state in ipairs(states) do
        local index, start = index_key(q, state), 0
        while true do
            local ids = redis.call("zrange", index, start, start + 99)
            if #ids == 0 then
                break
            end
            for _, id in ipairs(ids) do
                if redis.call("hget", job_key(id), "rid") == rid then
                    return id
                end
            end
            start = start + 100
        end
    end
    return nil
end

local function dead_letter(q, rid, data)
    redis.call("zadd", q.xq, now, rid)
    redis.call("hset", q.xmsgs, rid, data)
    redis.call("hdel", q.msgs, rid)
end

-- Take a held message back from `holder` to the front of its list. The
-- record's delivery grows at once, so the holder's late start or outcome
-- is refused. A message whose record points elsewhere (superseded) or
-- whose job was deleted is dropped instead. Returns the job id put back,
-- or nil.
local function hand_back(q, holder, rid)
    if redis.call("srem", acks_key(holder, q), rid) == 0 then
        return nil
    end
    local data = redis.call("hget", q.msgs, rid)
    if not data then
        return nil
    end
    local id = message_id(data)
    if id then
        local record = job_key(id)
        local current = redis.call("hget", record, "rid")
        if not current and redis.call("exists", ns .. ":deleted:" .. id) == 1 then
            redis.call("hdel", q.msgs, rid)
            return nil
        end
        if current and current ~= rid then
            redis.call("hdel", q.msgs, rid)
            return nil
        end
        if current then
            redis.call("hincrby", record, "delivery", 1)
            if not q.delay then
                set_state(q, id, "waiting")
                redis.call("hdel", record, "worker")
            end
        end
    end
    push_ready(q, id, rid, true)
    return id or rid
end

-- A failed job goes back to the tail of its queue with a fresh attempt
-- budget and its final-failure claim released.
local function retry_one(id)
    local record = job_key(id)
    if redis.call("hget", record, "state") ~= "failed" or redis.call("hget", record, "queue") ~= queue.canonical then
        return false
    end
    local rid = redis.call("hget", record, "rid")
    local data = redis.call("hget", queue.xmsgs, rid) or redis.call("hget", record, "payload")
    if not data then
        return false
    end
    local main = Q(queue.canonical)
    redis.call("zrem", main.xq, rid)
    redis.call("hdel", main.xmsgs, rid)
    redis.call("hset", main.msgs, rid, data)
    push_ready(main, id, rid)
    redis.call("hset", record, "attempts", 0)
    redis.call("hdel", record, "final_failure", "finished_at", "eta")
    redis.call("persist", record)
    set_state(main, id, "waiting")
    return true
end

-- A held job ends cancelled (its start, or its holder after the run):
-- its message leaves this worker, the record becomes cancelled, counted once.
local function end_cancelled(rid, id, retention, err)
    redis.call("srem", acks_key(worker, queue), rid)
    redis.call("hdel", queue.msgs, rid)
    local record = job_key(id)
    if redis.call("hget", record, "state") ~= "cancelled" then
        set_state(queue, id, "cancelled", {"finished_at", now})
        if err and err ~= "" then
            redis.call("hset", record, "error", err)
        end
        redis.call("hdel", record, "worker")
        redis.call("pexpire", record, retention)
        redis.call("hincrby", queue.totals, "cancelled", 1)
    end
end

-- The job is done: drop its message; the record becomes completed.
-- Returns the fence (1 done, 0 job gone, -1 superseded: nothing moved).
local function ack_one(rid, id, delivery, retention)
    local f, r = fence(id, rid, delivery, "state", "slot")
    if f == -1 then
        return -1
    end
    redis.call("srem", acks_key(worker, queue), rid)
    redis.call("hdel", queue.msgs, rid)
    -- A call repeated after a lost reply counts the completion once.
    local state = r[3]
    if f == 1 and state ~= "completed" and state ~= "cancelled" then
        set_state(queue, id, "completed", {"finished_at", now}, {state = state, slot = r[4]})
        redis.call("hdel", job_key(id), "error", "worker")
        redis.call("pexpire", job_key(id), retention)
        redis.call("hincrby", queue.totals, "completed", 1)
    end
    return f
end

-- Acks buffered by the worker ride along with its next call: ARGV[first] =
-- retention_ms, ARGV[first + 1] = count, then rid, id, delivery triples.
-- Returns the ids whose ack was refused (superseded deliveries).
local function ack_buffered(first)
    local retention, count = ARGV[first], tonumber(ARGV[first + 1])
    local refused = {}
    for i = 0, count - 1 do
        local base = first + 2 + 3 * i
        if ack_one(ARGV[base], ARGV[base + 1], ARGV[base + 2], retention) == -1 then
            table.insert(refused, ARGV[base + 1])
        end
    end
    return refused
end

-- One job of an enqueue: returns its id and 1 when a live job held its key
-- (nothing written but the answer), else 0. With a key, the key is taken and
-- the message pushed in one step; a key whose job record is gone is free again.
-- answer_ttl: ms a call may still be repeated (Python's _send_enqueue).
local function enqueue_one(q, rid, id, data, job, key, dedup_ttl, delay, err, priority, group, answer_ttl, aging)
    -- A deleted job's message may still come back: drop it. A call repeated
    -- after a lost reply (same rid) must not push the message twice, even
    -- if the job ran and was retried as a new message meanwhile (its record
    -- keeps the rid it was enqueued with).
    -- Read with them: the fields this call writes only where they are absent (one HSET below).
    local seen = redis.call("hmget", job_key(id), "rid", "enqueued_rid", "enqueued_at", "attempts", "delivery", "group",
                            "state")
    if seen[1] == rid or seen[2] == rid or redis.call("hexists", q.msgs, rid) == 1
            or redis.call("exists", ns .. ":deleted:" .. id) == 1 then
        return id, 0
    end
    -- Nor may it enqueue a message the first call found a duplicate: by the
    -- repeat (a socket timeout later) the key may have expired, or its job
    -- been deleted. The repeat answers what the call did: that holder.
    local answered = ns .. ":deduplicated:" .. rid
    if key ~= "" then
        local first = redis.call("get", answered)
        if first then
            return first, 1
        end
        local dedup_key = ns .. ":dedup:" .. key
        local holder = redis.call("get", dedup_key)
        if holder and redis.call("exists", job_key(holder)) == 1 then
            redis.call("set", answered, holder, "PX", answer_ttl)
            return holder, 1
        end
        redis.call("set", dedup_key, id, "PX", dedup_ttl)
    end
    local record = job_key(id)
    -- The record's fields in one write, before push_ready, which reads priority and group to pick the
    -- list: enqueued_at, attempts and delivery only where absent (a re-enqueue keeps them).
    local fields = {"queue", q.canonical, "job", job, "rid", rid, "enqueued_rid", rid, "payload", data,
                    "priority", tonumber(priority) or 0}
    if group ~= "" then
        -- Its lead in its group's rank (push_ready): priority x the producer's aging, ms.
        table.insert(fields, "group"); table.insert(fields, group)
        table.insert(fields, "lead"); table.insert(fields, (tonumber(priority) or 0) * aging)
    end
    if not seen[3] then
        table.insert(fields, "enqueued_at"); table.insert(fields, now)
    end
    if not seen[4] then
        table.insert(fields, "attempts"); table.insert(fields, 0)
    end
    if not seen[5] then
        table.insert(fields, "delivery"); table.insert(fields, 0)
    end
    if key ~= "" then
        table.insert(fields, "key"); table.insert(fields, key)
    end
    if err ~= "" then
        table.insert(fields, "error"); table.insert(fields, err)
    end
    if group == "" and not (seen[1] or seen[2] or seen[3] or seen[4] or seen[5] or seen[6] or seen[7]) then
        -- A new job of the default group, nearly every enqueue: no record to read back, no slot, no
        -- index to leave. The general path's writes, with the record's state and ready time in its
        -- one HSET (push_ready, set_state and the counter below, without their reads).
        local p, state = 0, "waiting"
        if q.delay then
            state = "delayed"
            table.insert(fields, "eta"); table.insert(fields, now + (tonumber(delay) or 0))
        else
            p = math.max(0, math.min(MAX_PRIORITY, tonumber(priority) or 0))
            table.insert(fields, "ready_at"); table.insert(fields, now)
        end
        table.insert(fields, "state"); table.insert(fields, state)
        table.insert(fields, "updated_at"); table.insert(fields, now)
        redis.call("hset", record, unpack(fields))
        redis.call("hset", q.msgs, rid, data)
        if p > 0 then
            redis.call("sadd", levels_key(q), p)
            redis.call("hset", ranks_key(q), rid, now)
        end
        redis.call("rpush", level_list(q, p), rid)
        wake(q)
        redis.call("zadd", index_key(q, state), now, id)
        redis.call("hincrby", ns .. ":fleet:enqueued", q.canonical .. "\31" .. job, 1)
        return id, 0
    end
    redis.call("hset", record, unpack(fields))
    if group == "" and seen[6] then
        redis.call("hdel", record, "group") -- a re-enqueue of the same job in the default group
    end
    redis.call("hset", q.msgs, rid, data)
    push_ready(q, id, rid)
    redis.call("persist", record)
    if q.delay then
        -- Due on the server's clock; each worker holding it waits out what is left on its own.
        set_state(q, id, "delayed", {"eta", now + (tonumber(delay) or 0)})
    else
        set_state(q, id, "waiting")
    end
    -- Counted with the job, in the same call: exact, and no round trip of its own.
    redis.call("hincrby", ns .. ":fleet:enqueued", q.canonical .. "\31" .. job, 1)
    return id, 0
end

-- enqueue(dedup_ttl_ms, n, then n times: queue, rid, id, data, job, key,
-- delay_ms, error, priority, group ("": the default group), then answer_ttl_ms,
-- aging_ms (the rank a priority level is worth in a named group; an older
-- producer sends none: 60 s))
-- -> {id, deduplicated, ...}, one pair per job in order. A whole batch is one
-- script call, so it is all or nothing: Redis runs a script alone, and
-- refuses one over maxmemory (OOM) at its first write, never after it (a
-- script that has written runs to its end). Repeated after a lost reply,
-- every job is found by its rid (a duplicate by the answer it got) and
-- nothing doubles. answer_ttl_ms: how long a duplicate's answer is kept (an
-- hour when the caller omits it).
if command == "enqueue" then
    local dedup_ttl, count = ARGV[4], tonumber(ARGV[5])
    local answer_ttl = tonumber(ARGV[6 + 10 * count]) or 3600000
    local aging = tonumber(ARGV[7 + 10 * count] or "") or 60000
    local out = {}
    for i = 0, count - 1 do
        local b = 6 + 10 * i
        local id, duplicate = enqueue_one(Q(ARGV[b]), ARGV[b + 1], ARGV[b + 2], ARGV[b + 3], ARGV[b + 4],
                                          ARGV[b + 5], dedup_ttl, ARGV[b + 6], ARGV[b + 7], ARGV[b + 8],
                                          ARGV[b + 9], answer_ttl, aging)
        out[#out + 1] = id
        out[#out + 1] = duplicate
    end
    return out

-- fetch(count, aging_ms) -> {rid, data, delivery, note, wait_ms, ...}; nothing from a paused
-- queue; lowest rank first (ready_pop). Each message handed out is a new delivery; a job fetched from
-- its queue reads `active` (claimed, as on Postgres) until it ends or is
-- handed back. A message without a record (an older producer's) gets one
-- (note "adopted"); one whose record points at another message, or whose
-- job was deleted, is dropped; one whose final-failure hooks were claimed
-- but never marked done (its worker died in them) comes back with note
-- "finalize"; an undecodable one comes back with
-- delivery 0 so the worker dead-letters it. wait_ms: from a delay queue,
-- how long the job is still delayed on the server's clock ("" if unknown),
-- so a worker whose clock is off still holds it for the right time.
elseif command == "fetch" then
    heartbeat()
    redis.call("sadd", acksets_key(worker), queue.name)
    if redis.call("sismember", ns .. ":paused", queue.canonical) == 1 then
        return {}
    end
    local out = {}
    local wanted = tonumber(ARGV[4])
    local aging = tonumber(ARGV[5] or "") or 60000
    local cap = tonumber(ARGV[6] or "") or 0
    -- The queue's settings' group weights (group, weight pairs): they win over gweights.
    local configured = {}
    for i = 7, #ARGV - 1, 2 do
        configured[ARGV[i]] = tonumber(ARGV[i + 1])
    end
    local heads = ready_heads(queue, aging)
    local ring = ring_key(queue)
    local misses = 0
    while #out < 5 * wanted do
        local rid = nil
        local turns = queue.delay and 0 or redis.call("llen", ring)
        if turns == 0 then
            rid = ready_pop(queue, aging, heads)
            if not rid then
                break
            end
        else
            -- Round-robin: the group whose turn it is gives one message, unless it holds its cap.
            -- The default group's turn takes its lowest rank (priority with aging, ready_pop);
            -- a named group's its set's lowest (push_ready), after any left in an older release's list.
            if misses > turns then
                break -- a whole round gave nothing
            end
            local g = redis.call("lpop", ring)
            if g == "" then
                rid = ready_pop(queue, aging, heads)
                redis.call("rpush", ring, "")
            elseif cap > 0 and tonumber(redis.call("hget", running_key(queue), g) or "0") >= cap then
                redis.call("rpush", ring, g)
                redis.call("hdel", turn_key(queue), g) -- at its cap: its round ends
            else
                local list, set = group_list(queue, g), group_set(queue, g)
                rid = redis.call("lpop", list)
                if not rid then
                    rid = redis.call("zpopmin", set)[1]
                end
                if redis.call("zcard", set) > 0 or redis.call("llen", list) > 0 then
                    -- Weighted round-robin: a group of weight w takes w turns in a row, then goes to the back.
                    -- Weights only pick the group; the message is fenced below like any other.
                    local w = configured[g] or tonumber(redis.call("hget", weights_key(queue), g) or "") or 1
                    if w > 1 and redis.call("hincrby", turn_key(queue), g, 1) < w then
                        redis.call("lpush", ring, g)
                    else
                        if w > 1 then
                            redis.call("hdel", turn_key(queue), g)
                        end
                        redis.call("rpush", ring, g)
                    end
                else
                    redis.call("hdel", turn_key(queue), g) -- out of jobs: it leaves the ring, its round ends
                end
            end
            tidy_ring(queue)
            if rid then
                misses = 0
            else
                misses = misses + 1
            end
        end
        local data = rid and redis.call("hget", queue.msgs, rid)
        if data then
            local id, actor = message_id(data)
            local keep = not id -- undecodable: the worker dead-letters it
            local note = ""
            local wait = ""
            local delivery = 0
            if id then
                local record = job_key(id)
                local r = redis.call("hmget", record, "rid", "state", "group", "slot", "final_failure")
                local current = r[1]
                local known = {state = r[2], group = r[3], slot = r[4]}
                if not current then
                    if redis.call("exists", ns .. ":deleted:" .. id) == 1 then
                        id = nil
                    else
                        redis.call("hset", record, "queue", queue.canonical, "job",
                                   tostring(actor or ""), "rid", rid, "payload", data,
                                   "enqueued_at", now, "attempts", 0, "delivery", 0)
                        set_state(queue, id, queue.delay and "delayed" or "waiting")
                        current = rid
                        note = "adopted"
                        known = nil
                    end
                end
                if id and current ~= rid then
                    id = nil
                end
                if not id then
                    redis.call("hdel", queue.msgs, rid)
                else
                    keep = true
                    delivery = redis.call("hincrby", record, "delivery", 1)
                    if not queue.delay then
                        set_state(queue, id, "active", {"worker", worker}, known)
                        if note ~= "adopted" and r[5] then
                            note = "finalize" -- failed for good; its hooks never finished: run them only
                        end
                    else
                        local eta = tonumber(redis.call("hget", record, "eta") or "")
                        if eta then
                            wait = math.max(0, eta - now)
                        end
                    end
                end
            end
            if keep then
                redis.call("sadd", acks_key(worker, queue), rid)
                table.insert(out, rid)
                table.insert(out, data)
                table.insert(out, delivery)
                table.insert(out, note)
                table.insert(out, wait)
            end
        end
    end
    return out

-- start(rid, id, delivery, retention_ms, n, buffered acks...) ->
-- {attempt, refused ids...}: attempt counts every start of the job,
-- including those whose worker died; 0 when the job was deleted, -1 when
-- this delivery was superseded (the job was handed to another).
elseif command == "start" then
    heartbeat()
    local refused = ack_buffered(7)
    local rid, id, delivery = ARGV[4], ARGV[5], ARGV[6]
    local f, r = fence(id, rid, delivery, "state", "started_delivery", "attempts", "cancel_requested")
    local attempt = f
    if f == 1 then
        if r[3] ~= "active" then
            attempt = -1
        elseif r[6] then
            end_cancelled(rid, id, ARGV[7], "")
            attempt = -2 -- its cancellation was asked before it started: it never runs
        elseif tostring(r[4]) == tostring(delivery) then
            attempt = tonumber(r[5]) -- the same start repeated after a lost reply counts once
        else
            attempt = (tonumber(r[5]) or 0) + 1
            redis.call("hset", job_key(id), "attempts", attempt, "started_at", now, "worker", worker,
                       "updated_at", now, "started_delivery", delivery)
        end
    end
    table.insert(refused, 1, attempt)
    return refused

-- acks(retention_ms, n, rid, id, delivery, ...) -> refused ids.
elseif command == "acks" then
    heartbeat()
    return ack_buffered(4)

-- nack(rid, id, delivery, retention_ms, error) -> fence: the job failed for good.
elseif command == "nack" then
    heartbeat()
    local rid, id, delivery, retention, err = ARGV[4], ARGV[5], ARGV[6], ARGV[7], ARGV[8]
    local f = fence(id, rid, delivery)
    if f == -1 then
        return -1
    end
    if redis.call("srem", acks_key(worker, queue), rid) > 0 then
        local data = redis.call("hget", queue.msgs, rid)
        if data then
            dead_letter(queue, rid, data)
        end
    end
    local state = redis.call("hget", job_key(id), "state")
    if f == 1 and state ~= "failed" and state ~= "cancelled" then
        set_state(queue, id, "failed", {"finished_at", now, "error", err})
        redis.call("hdel", job_key(id), "worker")
        redis.call("pexpire", job_key(id), retention)
        redis.call("hincrby", queue.totals, "failed", 1)
    end
    return f

-- retry(rid, id, delivery, new_rid, data, delay_ms, error) -> fence.
-- The delivery failed and the job runs again: in one step its message
-- leaves this worker and the retry's message enters the delay queue (or
-- the queue, without an eta). Nothing is written for a superseded delivery.
elseif command == "retry" then
    heartbeat()
    local rid, id, delivery, new_rid, data, delay, err = ARGV[4], ARGV[5], ARGV[6], ARGV[7], ARGV[8], ARGV[9], ARGV[10]
    local f = fence(id, rid, delivery)
    if f == 1 and redis.call("hget", job_key(id), "state") == "cancelled" then
        f = 0 -- ended cancelled: it never runs again
    end
    if f ~= 1 then
        if f == 0 then
            redis.call("srem", acks_key(worker, queue), rid)
            redis.call("hdel", queue.msgs, rid)
        end
        return f
    end
    redis.call("srem", acks_key(worker, queue), rid)
    redis.call("hdel", queue.msgs, rid)
    local record = job_key(id)
    -- A park (ctx.wait_for): its event's kept signal, if any, resolves it at once.
    local event, resume = ARGV[11] or "", ARGV[12] or ""
    local fact = nil
    if event ~= "" then
        fact = redis.call("get", event_key(event))
        if fact then
            redis.call("hsetnx", record, "wait:" .. event, fact)
            data, delay = resume, ""
        end
    end
    local target = Q(delay ~= "" and (queue.canonical .. ".DQ") or queue.canonical)
    redis.call("hset", target.msgs, new_rid, data)
    push_ready(target, id, new_rid)
    redis.call("hset", record, "rid", new_rid, "payload", data)
    redis.call("hdel", record, "worker")
    if err ~= "" then
        redis.call("hset", record, "error", err)
    end
    if event ~= "" and not fact then
        redis.call("sadd", event_waiters_key(event), id)
        set_state(target, id, "awaiting", {"eta", now + tonumber(delay), "event", event, "resume", resume})
    elseif delay ~= "" then
        set_state(target, id, "delayed", {"eta", now + tonumber(delay)})
    else
        redis.call("hdel", record, "eta")
        set_state(target, id, "waiting")
    end
    return 1

-- promote(rid, id, delivery, data) -> fence, on a delay queue: the held
-- message's delay is over and it moves to its queue, in one step (a crash
-- can neither lose it nor promote it twice).
elseif command == "promote" then
    heartbeat()
    local rid, id, delivery, data = ARGV[4], ARGV[5], ARGV[6], ARGV[7]
    local f = fence(id, rid, delivery)
    if f == -1 then
        return -1
    end
    -- Only while this worker still holds it: a repeated call promotes once.
    local held = redis.call("srem", acks_key(worker, queue), rid)
    redis.call("hdel", queue.msgs, rid)
    if f == 1 and held == 1 then
        local main = Q(queue.canonical)
        redis.call("hset", main.msgs, rid, data)
        push_ready(main, id, rid)
        redis.call("hdel", job_key(id), "eta")
        forget_wait(id)
        set_state(main, id, "waiting")
        return 1
    end
    return 0

-- promote_job(id, rid, data) -> 1 when the delayed job went to its queue,
-- else 0. An operator runs a delayed job now. Its message (rid) waits in
-- the delay queue's list, or is held by a worker's delay consumer until
-- its eta (in that worker's acks set of the delay queue). In one step the
-- rid leaves both, the record's delivery grows (so the holder's own
-- promotion at the eta is refused by the fence and its copy dropped), and
-- the message as the caller re-encoded it (without its eta) enters the
-- queue, waiting. A job no longer delayed with this message: nothing moves.
elseif command == "promote_job" then
    local id, rid, data = ARGV[4], ARGV[5], ARGV[6]
    local record = job_key(id)
    local r = redis.call("hmget", record, "state", "rid", "queue")
    local dq = Q(queue.canonical .. ".DQ")
    if (r[1] ~= "delayed" and r[1] ~= "awaiting") or r[2] ~= rid or r[3] ~= queue.canonical
            or redis.call("hexists", dq.msgs, rid) == 0 then
        return 0
    end
    redis.call("lrem", dq.list, 0, rid)
    -- Whoever holds it is a live (heartbeating) worker: recovery forgets a dead one only after handing back.
    for _, holder in ipairs(redis.call("zrange", heartbeats_key, 0, -1)) do
        redis.call("srem", acks_key(holder, dq), rid)
    end
    redis.call("hdel", dq.msgs, rid)
    redis.call("hincrby", record, "delivery", 1)
    local main = Q(queue.canonical)
    redis.call("hset", main.msgs, rid, data)
    push_ready(main, id, rid)
    redis.call("hdel", record, "eta")
    forget_wait(id)
    set_state(main, id, "waiting")
    return 1

-- signal(name, resolution, ttl_ms) -> how many jobs resumed. Every job
-- parked awaiting `name` moves to its queue as promote_job moves a delayed
-- one (its delivery grows: the holder of its delayed copy is fenced off),
-- with its resolution stored insert-first; a job no longer awaiting it
-- (resumed by an earlier signal, timed out, deleted) is left alone, so two
-- signals, or a signal and the timeout, resume a job once. The signal is
-- kept for ttl_ms (the first one's, while kept) for jobs that wait later.
elseif command == "signal" then
    local name, resolution, ttl = ARGV[4], ARGV[5], ARGV[6]
    local waiters = event_waiters_key(name)
    local resumed = 0
    for _, id in ipairs(redis.call("smembers", waiters)) do
        local record = job_key(id)
        local r = redis.call("hmget", record, "state", "event", "rid", "queue", "resume")
        if r[1] == "awaiting" and r[2] == name and r[5] then
            local rid, main = r[3], Q(r[4])
            local dq = Q(r[4] .. ".DQ")
            redis.call("lrem", dq.list, 0, rid)
            for _, holder in ipairs(redis.call("zrange", heartbeats_key, 0, -1)) do
                redis.call("srem", acks_key(holder, dq), rid)
            end
            redis.call("hdel", dq.msgs, rid)
            redis.call("hincrby", record, "delivery", 1)
            redis.call("hset", main.msgs, rid, r[5])
            push_ready(main, id, rid)
            redis.call("hsetnx", record, "wait:" .. name, resolution)
            redis.call("hset", record, "payload", r[5])
            redis.call("hdel", record, "eta", "event", "resume")
            set_state(main, id, "waiting")
            resumed = resumed + 1
        end
    end
    redis.call("del", waiters)
    redis.call("set", event_key(name), resolution, "PX", ttl, "NX")
    return resumed

-- resolve_wait(id, name, timed_out) -> the job's resolution of its wait
-- for `name`, recorded now (insert-first) from a kept signal or, when the
-- job came back from a park on it without one (timed_out = "1"), as a
-- timeout; nil when there is none yet (the job parks).
elseif command == "resolve_wait" then
    local record, name = job_key(ARGV[4]), ARGV[5]
    local field = "wait:" .. name
    local got = redis.call("hget", record, field)
    if got then
        return got
    end
    if redis.call("exists", record) == 0 then
        return false
    end
    local fact = redis.call("get", event_key(name))
    if not fact and ARGV[6] == "1" then
        fact = '{"timeout":true}'
    end
    if fact then
        redis.call("hset", record, field, fact)
    end
    return fact or false

-- claim_final(rid, id, delivery, error) -> 1 when this delivery runs the
-- final-failure hooks, -1 when it is superseded. The claim names the
-- delivery; the nack that follows the hooks marks them done (the record
-- becomes failed). A worker that dies between the two leaves the claim
-- on a held message: recovery hands it out again and fetch marks that
-- delivery "finalize", so it claims again and runs the hooks only, never
-- the body (hooks are at least once). A repeat after a lost reply claims
-- again too. The error is kept on the record for that next delivery.
elseif command == "claim_final" then
    local rid, id, delivery, err = ARGV[4], ARGV[5], ARGV[6], ARGV[7]
    if fence(id, rid, delivery) ~= 1 then
        return -1
    end
    local record = job_key(id)
    redis.call("hset", record, "final_failure", delivery)
    if err and err ~= "" then
        redis.call("hset", record, "error", err)
    end
    return 1

-- poison(rid, delivery, retention_ms, error) -> {claimed, id, job}: a
-- message the worker cannot decode goes to the dead letters alone; the
-- consumer carries on with the rest. When its job id could be read (the
-- fetch then handed it out as a delivery) and that delivery is current,
-- or it could not (delivery 0) but a waiting record holds its rid (the
-- first call, from the worker that holds it: job_of_rid),
-- its job fails in the same step, as on Postgres (fail_malformed): state
-- failed with the error, counted once, and claimed = 1 when this call took
-- the final-failure claim (again when the same call is repeated), so the
-- worker runs the job's hook. job is the record's job name ("" if none).
elseif command == "poison" then
    local rid, delivery, retention, err = ARGV[4], ARGV[5], tonumber(ARGV[6]), ARGV[7]
    local held = redis.call("srem", acks_key(worker, queue), rid)
    local data = redis.call("hget", queue.msgs, rid)
    if data then
        dead_letter(queue, rid, data)
    end
    local id = nil
    if delivery ~= "0" then
        id = message_id(data or redis.call("hget", queue.xmsgs, rid) or "")
    elseif data and held == 1 then
        -- Its id unreadable (JSON that is no message, a truncated body): the job
        -- is the one whose record holds this rid. This call is its delivery.
        id = job_of_rid(queue, rid)
        if id then
            delivery = tostring(redis.call("hincrby", job_key(id), "delivery", 1))
        end
    end
    if not id or fence(id, rid, delivery) ~= 1 then
        if data and held == 1 then
            redis.call("hincrby", queue.totals, "failed", 1)
        end
        return {0, id or "", ""}
    end
    local record = job_key(id)
    if redis.call("hget", record, "state") ~= "failed" then
        set_state(queue, id, "failed", {"finished_at", now, "error", err})
        redis.call("hdel", record, "worker")
        redis.call("pexpire", record, retention)
        redis.call("hincrby", queue.totals, "failed", 1)
    end
    local claimed = 0
    if redis.call("hsetnx", record, "final_failure", delivery) == 1
            or redis.call("hget", record, "final_failure") == delivery then
        claimed = 1
    end
    return {claimed, id, redis.call("hget", record, "job") or ""}

-- requeue(rid, delivery, ...) -> ids handed back: messages this worker
-- holds and will not run (prefetched, or its start could not be written).
elseif command == "requeue" then
    heartbeat()
    local out = {}
    for i = 4, #ARGV, 2 do
        local rid, delivery = ARGV[i], ARGV[i + 1]
        local data = redis.call("hget", queue.msgs, rid)
        local id = data and message_id(data)
        if id and fence(id, rid, delivery) == -1 then
            id = nil -- superseded: the job is someone else's now
        elseif data then
            id = hand_back(queue, worker, rid)
        end
        if id then
            table.insert(out, id)
        end
    end
    return out

-- release(held rid...) -> ids handed back: this worker's messages of the
-- queue that are not in flight in it (a replaced consumer's, an outcome
-- that could not be written) go back to the queue. Without arguments:
-- all of them (a graceful stop).
elseif command == "release" then
    heartbeat()
    local held = {}
    for i = 4, #ARGV do
        held[ARGV[i]] = true
    end
    local out = {}
    for _, rid in ipairs(redis.call("smembers", acks_key(worker, queue))) do
        if not held[rid] then
            local id = hand_back(queue, worker, rid)
            if id then
                table.insert(out, id)
            end
        end
    end
    return out

-- leave(): a stopping worker that holds nothing is forgotten at once.
elseif command == "leave" then
    local left = 0
    for _, name in ipairs(redis.call("smembers", acksets_key(worker))) do
        left = left + redis.call("scard", acks_key(worker, Q(name)))
    end
    if left == 0 then
        redis.call("del", acksets_key(worker))
        redis.call("zrem", heartbeats_key, worker)
    end
    return left

-- maintain(heartbeat_timeout_ms, retention_ms, dead_message_ttl_ms, gap_ms, queue...)
-- -> {queue, id, ...} of recovered jobs. Messages held by workers whose
-- heartbeat is older than the timeout (server clock) go back to the front
-- of their lists as new deliveries; finished records leave the indexes
-- after the retention. After a gap between recovery passes longer than
-- gap_ms (Redis was paused, down, restarted from its append-only file, or
-- nobody ran), nobody is declared dead for one heartbeat timeout: every
-- live worker's heartbeat is as old as the gap, and its calls (queued
-- behind a pause, or reconnecting) need the time to land first.
-- Safe to run from every worker at once.
elseif command == "maintain" then
    heartbeat()
    local timeout, retention, dead_ttl = tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6])
    local gap = tonumber(ARGV[7])
    local names = {}
    for i = 8, #ARGV do
        names[#names + 1] = ARGV[i]
    end
    local recovered = {}
    local marker = ns .. ":__maintained_at__"
    local resume_key = ns .. ":__recovery_resumes_at__"
    local last = tonumber(redis.call("get", marker) or now)
    redis.call("set", marker, now)
    if now - last > gap then
        redis.call("set", resume_key, now + timeout)
    end
    if now >= tonumber(redis.call("get", resume_key) or 0) then
        for _, dead in ipairs(redis.call("zrangebyscore", heartbeats_key, 0, now - timeout)) do
            local seen = {}
            local held = redis.call("smembers", acksets_key(dead))
            for _, name in ipairs(names) do
                held[#held + 1] = name
            end
            for _, name in ipairs(held) do
                if not seen[name] then
                    seen[name] = true
                    local q = Q(name)
                    for _, rid in ipairs(redis.call("smembers", acks_key(dead, q))) do
                        local id = hand_back(q, dead, rid)
                        if id then
                            table.insert(recovered, q.canonical)
                            table.insert(recovered, id)
                        end
                    end
                    redis.call("del", acks_key(dead, q))
                end
            end
            redis.call("del", acksets_key(dead))
            redis.call("zrem", heartbeats_key, dead)
        end
    end
    local prune_left = PRUNE_BATCH
    for _, name in ipairs(names) do
        local q = Q(name)
        if not q.delay then
            -- A batch per index and pass, the oldest by rank (the index is scored by time, so the
            -- entries past the retention are its first ranks): a fleet back after a long stop
            -- does not hold Redis for every entry that expired meanwhile; later passes take the rest.
            for _, state in ipairs({"completed", "failed", "cancelled"}) do
                local index = index_key(q, state)
                local old = prune_left > 0 and redis.call("zcount", index, 0, now - retention) or 0
                if old > 0 then
                    local take = math.min(old, prune_left)
                    redis.call("zremrangebyrank", index, 0, take - 1)
                    prune_left = prune_left - take
                end
            end
            for _, rid in ipairs(redis.call("zrangebyscore", q.xq, 0, now - dead_ttl, "LIMIT", 0, 1000)) do
                redis.call("zrem", q.xq, rid)
                redis.call("hdel", q.xmsgs, rid)
            end
        end
    end
    return recovered

-- retry_failed(batch) -> {retried, looked_at}: up to `batch` jobs of the
-- queue's failed index go back to the queue (see retry_one).
elseif command == "retry_failed" then
    local batch = tonumber(ARGV[4])
    local ids = redis.call("zrange", index_key(queue, "failed"), 0, batch - 1)
    local retried = 0
    for _, id in ipairs(ids) do
        if retry_one(id) then
            retried = retried + 1
        else
            redis.call("zrem", index_key(queue, "failed"), id)
        end
    end
    return {retried, #ids}

-- retry_job(id) -> 1 when the failed job went back to its queue, else 0.
elseif command == "retry_job" then
    return retry_one(ARGV[4]) and 1 or 0

-- delete(id, retention_ms) -> 1 when the job was removed, 0 when it is
-- unknown or held by a worker (active). Its message leaves every list.
elseif command == "delete" then
    local id, retention = ARGV[4], tonumber(ARGV[5])
    local record = job_key(id)
    local state = redis.call("hget", record, "state")
    if not state or state == "active" or redis.call("hget", record, "queue") ~= queue.canonical then
        return 0
    end
    local rid = redis.call("hget", record, "rid")
    if rid then
        for _, name in ipairs({queue.canonical, queue.canonical .. ".DQ"}) do
            local q = Q(name)
            unready(q, id, rid)
            redis.call("hdel", q.msgs, rid)
        end
        redis.call("zrem", queue.xq, rid)
        redis.call("hdel", queue.xmsgs, rid)
    end
    for _, s in ipairs(STATES) do
        redis.call("zrem", index_key(queue, s), id)
    end
    release_slot(queue, id)
    redis.call("del", record)
    redis.call("set", ns .. ":deleted:" .. id, now, "PX", retention)
    return 1

-- cancel(id, retention_ms, channel[, call, answer_ttl_ms]) -> {outcome}:
-- "cancelled" when the job was waiting or delayed (it ends cancelled now:
-- its message leaves its list, and a delay consumer holding it until its
-- eta is fenced off, as in promote_job), "requested" when a worker holds it
-- (cancel_requested is set and the id published on the channel: its holder
-- ends it), "finished" when it had ended or failed for good (its hooks may
-- still run), "" when unknown. `call` names
-- this call (one per cancel_job): its answer is kept answer_ttl_ms, so the
-- same call repeated after a lost reply (redis-py's retry) answers what the
-- first one did, not "finished" for the job that first one ended.
elseif command == "cancel" then
    local id, retention, channel = ARGV[4], ARGV[5], ARGV[6]
    local call, answer_ttl = ARGV[7] or "", tonumber(ARGV[8] or "") or 3600000
    local answered = call ~= "" and (ns .. ":cancel_answer:" .. call) or nil
    if answered then
        local first = redis.call("get", answered)
        if first then
            return first
        end
    end
    local function answer(outcome)
        if answered then
            redis.call("set", answered, outcome, "PX", answer_ttl)
        end
        return outcome
    end
    local record = job_key(id)
    local r = redis.call("hmget", record, "state", "rid", "queue")
    if not r[1] or r[3] ~= queue.canonical then
        return ""
    end
    -- Failed for good (its final failure claimed): its end is decided, and its hooks still run to their
    -- end, in a finalize delivery when their worker died (waiting again meanwhile): never cancelled.
    if redis.call("hexists", record, "final_failure") == 1 then
        return answer("finished")
    end
    if r[1] == "active" then
        if not redis.call("hget", record, "cancel_requested") then
            redis.call("hset", record, "cancel_requested", now)
        end
        redis.call("publish", channel, id)
        return answer("requested")
    end
    if r[1] ~= "waiting" and r[1] ~= "delayed" and r[1] ~= "awaiting" then
        return answer("finished")
    end
    forget_wait(id)  -- an awaiting job leaves its event's waiters (its delayed copy goes below)
    local rid = r[2]
    if rid then
        local dq = Q(queue.canonical .. ".DQ")
        for _, q in ipairs({queue, dq}) do
            unready(q, id, rid)
            redis.call("hdel", q.msgs, rid)
        end
        for _, holder in ipairs(redis.call("zrange", heartbeats_key, 0, -1)) do
            redis.call("srem", acks_key(holder, dq), rid)
        end
    end
    redis.call("hincrby", record, "delivery", 1)
    redis.call("hset", record, "cancel_requested", now)
    redis.call("hdel", record, "eta")
    set_state(queue, id, "cancelled", {"finished_at", now})
    redis.call("pexpire", record, retention)
    redis.call("hincrby", queue.totals, "cancelled", 1)
    return answer("cancelled")

-- cancelled(rid, id, delivery, retention_ms, error) -> fence: the holder of
-- a job whose cancellation was asked ends it cancelled, fenced like an ack
-- (nothing moves for a superseded delivery; the late ack, nack or retry of
-- any delivery cannot change a cancelled record). The worker runs the
-- cancel hook only on 1, so the same call repeated after a lost reply
-- answers 1 again: a record this very delivery ended cancelled.
elseif command == "cancelled" then
    heartbeat()
    local rid, id, delivery, retention, err = ARGV[4], ARGV[5], ARGV[6], ARGV[7], ARGV[8]
    local f = fence(id, rid, delivery)
    if f ~= 1 then
        return f
    end
    local r = redis.call("hmget", job_key(id), "state", "cancel_requested")
    if r[1] == "cancelled" and r[2] then
        return 1
    end
    if r[1] ~= "active" or not r[2] then
        return -1
    end
    end_cancelled(rid, id, retention, err)
    return 1

-- cancel_requested(id...) -> the ids of held jobs whose cancellation was asked.
elseif command == "cancel_requested" then
    local out = {}
    for i = 4, #ARGV do
        local r = redis.call("hmget", job_key(ARGV[i]), "state", "cancel_requested")
        if r[1] == "active" and r[2] then
            table.insert(out, ARGV[i])
        end
    end
    return out
end

return redis.error_reply("unknown command " .. command)
