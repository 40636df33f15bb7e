-- _lib.lua: helpers shared by every taskgate script. NOT a script on its own: the loader
-- (scripts.py) makes one Redis function library of this file followed by every script's body,
-- each registered (`register`) as a function. The server runs this file once, when the library
-- is loaded, so its locals outlive a call: what belongs to one call (KEYS, ARGV, B, NOW, the
-- deferred writes and wake-ups) is set afresh by `begin` at the start of every call.
--
-- Conventions every script follows:
--   KEYS[1]  the broker's hash-tagged base, e.g. "tg:{tg}:". Every key a script touches is
--            KEYS[1] .. <suffix>, so all keys share the hash tag and live in one Cluster slot.
--   ARGV[1]  "now" in integer microseconds since the Unix epoch, or "" to read the server's
--            TIME (Redis 7 replicates scripts by effects, so TIME is allowed anywhere);
--            prefixed with "s" when the caller wants the snapshots of the tasks the call
--            settles on its own (`REPORT`, see `settle_children`).
--   Replies  {"ok", ...} on success, {"<error code>", args...} when a check fails. Checks run
--            before the first write, so a failed check changes nothing. With the "s" prefix
--            the reply is {reply, {snapshot...}}: the script's own, then those snapshots.
--
-- Key patterns (all under KEYS[1]):
--   task:<id>          HASH   one execution: id type queue [payload] status created_at run_at
--                             [result] [last_error] attempts max_retry throttled lease_lost
--                             claims depends_on(JSON array) ignore_parent_failure(0/1)
--                             [business_key] [replay_of] [started_at] [finished_at]
--                             [timeout_ms] [group] [last_traceback] [progress] [trace_context]
--                             [priority] (absent: 0) cancel_requested(0/1)
--                             [token] [lease_until]; times in µs, timeout_ms in ms
--   queue:<queue>      ZSET   pending+retrying ids of priority 0, score run_at (µs): the
--                             claim order within that priority
--   due:<n>:<queue>:<type>  ZSET  the same entries of one type (<n> is the queue name's
--                             length, so the key is unambiguous): a claim of some types
--                             (`due_ids`) reads only theirs, however many others are due
--   pqueue:<p>:<queue> ZSET   as queue:<queue>, for the tasks of priority <p> (not 0)
--   pdue:<p>:<n>:<queue>:<type>  ZSET  as due:<n>:<queue>:<type>, for priority <p> (not 0)
--   prios:<queue>      ZSET   the priorities other than 0 that may have ready tasks in
--                             <queue>, member and score the priority; a claim drops one
--                             whose pqueue is empty (`due_ids`)
--   types:<queue>      SET    every type a task of <queue> was stored with (never shrinks)
--   leases             ZSET   running ids, score lease end (µs): what reap scans
--   children:<id>      SET    ids of the tasks that depend on <id>
--   steps:<id>         HASH   a task's durable steps: step name -> JSON result (`step.lua`)
--   bkey:<key>         LIST   executions of a business key, oldest first
--   replays            HASH   execution id -> id of the execution that replayed it
--   stats              HASH   "<status>:<type>" -> count, maintained by every transition
--   idx:all            ZSET   every id, score created_at (µs)
--   idx:type:<type>    ZSET   ids of one type, score created_at
--   idx:queue:<queue>  ZSET   ids of one queue, score created_at
--   idx:group:<group>  ZSET   ids of one group (of any queue), score created_at
--   idx:status:<st>    ZSET   ids in one status but running (`leases` holds those), score
--                             created_at
--   blocked:<queue>    ZSET   a queue's blocked ids, score created_at: with queue:<queue>,
--                             what back-pressure counts (enqueue.lua). Tasks blocked by a
--                             build without it are not in it: they count once they are ready
--   slots:<queue>      ZSET   shared slot token (= lease token) -> expiry (µs)
--   slot_waiters:<queue> ZSET claimer id -> expiry (µs): claimers owed a free slot
--   rate:<queue>       STRING the queue's GCRA arrival time (µs); expires once past
--   quota:<key>        HASH   start (window start, µs), used (units taken in it)
--   slot_groups:<queue> HASH  slot token -> group, for slots of grouped tasks leased by a
--                             claim with group limits; entries of slots no longer held are
--                             pruned by such claims (`prune_slot_groups`)
--   group_rate:<n>:<queue>:<group>  STRING  a group's GCRA arrival time (µs); expires once past
--   group_quota:<n>:<queue>:<group> HASH    a group's quota window: start (µs), used; expires
--                             one period after its window ended
--   hold:<queue>       STRING the queue's hold: until when (µs), or "-1" until resumed; no
--                             claim leases its tasks while held (`queue_hold`)
--   signal:<queue>     Pub/Sub CHANNEL (not a key): PUBLISHed when a task of <queue> becomes
--                             ready; wait_for_work subscribes to it

-- This call's keys and arguments, its base key and its "now" (µs, and as a string): set by
-- `begin`. Scripts read KEYS and ARGV as when they ran by EVAL.
local KEYS, ARGV, B, NOW, NOW_S
-- Whether this call reports what it settles on its own (ARGV[1]'s "s"), and the snapshots of
-- those tasks so far, in the order settled.
local REPORT, SETTLED

local READY = { pending = true, retrying = true }
local FINAL = { completed = true, failed = true, canceled = true }
local CANCELED_ERROR = { 'last_error', 'canceled' }

local function int_str(n)
  -- Lua's tostring() prints large numbers in exponent form; stored times must stay exact.
  return string.format('%.0f', n)
end

local function clock_now(now)
  if now ~= '' then
    return tonumber(now)
  end
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000000 + tonumber(t[2])
end

local function task_key(id)
  return B .. 'task:' .. id
end

local function load(id)
  local flat = redis.call('HGETALL', task_key(id))
  if #flat == 0 then
    return nil
  end
  local t = {}
  for i = 1, #flat, 2 do
    t[flat[i]] = flat[i + 1]
  end
  return t
end

-- A task as every script replies it: the values of SNAPSHOT_FIELDS in that order, false where
-- a field is unset (all false: no such task). The codec reads it by position, so a reply holds
-- half the strings of an HGETALL. SNAPSHOT_FIELDS and AT (field -> position) are not defined
-- here: the loader (scripts.py) writes them above this library from the codec's one list.
local function snapshot(id)
  return redis.call('HMGET', task_key(id), unpack(SNAPSHOT_FIELDS))
end

-- The fields a status change and a lease check need, from a snapshot (nil: no such task).
local function core_of(v)
  if not v[AT.id] then
    return nil
  end
  return { id = v[AT.id], type = v[AT.type], queue = v[AT.queue], status = v[AT.status],
    created_at = v[AT.created_at], token = v[AT.token], claims = v[AT.claims] }
end

-- Only what completing a held task needs (`complete_held`, after `held_by`), read alone: four
-- fields, where a snapshot would look up all of them in the hash (nil: no such task).
local function load_held(id)
  local f = redis.call('HMGET', task_key(id), 'status', 'token', 'type', 'created_at')
  if not f[1] then
    return nil
  end
  return { id = id, status = f[1], token = f[2], type = f[3], created_at = f[4] }
end

-- Wake wait_for_work callers of this queue in every process (a Pub/Sub message, not a key).
-- Once per queue per script: a batch making 1000 tasks ready wakes the same waiters as one.
-- Sent when the script ends (`publish_signals`, called by `register`'s wrapper): Redis sends
-- nothing a script publishes before the script has ended, so no subscriber can tell, and a
-- script made of two (`_chain.lua`) can hold back a wake-up the second part made pointless.
local SIGNALED
local function signal(queue)
  SIGNALED[queue] = true
end

local function publish_signals()
  for queue in pairs(SIGNALED) do
    redis.call('PUBLISH', B .. 'signal:' .. queue, '1')
  end
  SIGNALED = {}
end

-- A task's priority as the keys name it: its `priority` field, absent for 0 (tasks stored
-- before priorities existed have none either).
local function priority_of(stored)
  return stored or '0'
end

-- The ready set of priority `p` (a string, see `priority_of`) of a queue: queue:<queue> for
-- 0 -- the key every task had before priorities -- and pqueue:<p>:<queue> for another.
local function ready_key(queue, p)
  if p == '0' then
    return B .. 'queue:' .. queue
  end
  return B .. 'pqueue:' .. p .. ':' .. queue
end

-- The due set of one type and priority of a queue (see the key patterns above).
local function due_key(queue, task_type, p)
  if p == '0' then
    return B .. 'due:' .. #queue .. ':' .. queue .. ':' .. task_type
  end
  return B .. 'pdue:' .. p .. ':' .. #queue .. ':' .. queue .. ':' .. task_type
end

-- Note that `queue` may have ready tasks of priority `p` (not 0), as they are added.
local function note_priority(queue, p)
  redis.call('ZADD', B .. 'prios:' .. queue, p, p)
end

local ZERO_ONLY = { '0' }

-- The priorities of `queue` whose ready sets a claim walks, highest first, '0' among them:
-- a queue that only ever had priority 0 costs one read of an empty key.
local function priority_levels(queue)
  local others = redis.call('ZRANGE', B .. 'prios:' .. queue, 0, -1, 'REV')
  if #others == 0 then
    return ZERO_ONLY
  end
  local levels, placed = {}, false
  for _, p in ipairs(others) do
    if not placed and tonumber(p) < 0 then
      levels[#levels + 1], placed = '0', true
    end
    levels[#levels + 1] = p
  end
  if not placed then
    levels[#levels + 1] = '0'
  end
  return levels
end

-- How many tasks of `queue` are ready (pending or retrying), due or not, of every priority.
local function ready_count(queue)
  local count = 0
  for _, p in ipairs(priority_levels(queue)) do
    count = count + redis.call('ZCARD', ready_key(queue, p))
  end
  return count
end

-- Take the task out of the structure its current status keeps it in.
local function leave(t)
  if READY[t.status] then
    local p = priority_of(t.priority)
    redis.call('ZREM', ready_key(t.queue, p), t.id)
    redis.call('ZREM', due_key(t.queue, t.type, p), t.id)
  elseif t.status == 'running' then
    redis.call('ZREM', B .. 'leases', t.id)
    redis.call('HDEL', task_key(t.id), 'token', 'lease_until')
  end
end

-- Deferred writes: status counters, status indexes, and the queue/lease sets a claim moves
-- tasks between. A script that moves many tasks writes each such key once when it ends
-- (`flush_status`, called by `register`'s wrapper after every call) instead of several calls
-- per task. Only writes no later read of the same script depends on are deferred: the status
-- sets and counters (read only by `list`/`counts`), and the claim's own queue/lease moves
-- (claim scripts read the queue before leasing and never after).
local STATUS_COUNTS  -- "<status>:<type>" -> change
local ZSET_CHANGES   -- zset key -> { member -> score (add) or false (remove) }; last write wins

local function count_status(field, delta)
  STATUS_COUNTS[field] = (STATUS_COUNTS[field] or 0) + delta
end

local function zset_later(key, member, score)
  local members = ZSET_CHANGES[key]
  if not members then
    members = {}
    ZSET_CHANGES[key] = members
  end
  members[member] = score
end

-- Running tasks have no status set of their own: `leases` holds exactly them (`list` reads it;
-- reap.lua trims the `idx:status:running` of earlier builds).
local function index_status(status, id, score)
  if status ~= 'running' then
    zset_later(B .. 'idx:status:' .. status, id, score)
  end
end

-- Lua's unpack() has a stack limit: at most this many arguments per variadic call (even, so
-- score/member pairs are never split).
local VARIADIC_CHUNK = 2000

local function call_chunked(command, key, args)
  for first = 1, #args, VARIADIC_CHUNK do
    redis.call(command, key, unpack(args, first, math.min(first + VARIADIC_CHUNK - 1, #args)))
  end
end

local function flush_status()
  for key, members in pairs(ZSET_CHANGES) do
    local adds, removes = {}, {}
    for member, score in pairs(members) do
      if score then
        adds[#adds + 1] = score
        adds[#adds + 1] = member
      else
        removes[#removes + 1] = member
      end
    end
    call_chunked('ZADD', key, adds)
    call_chunked('ZREM', key, removes)
  end
  for field, delta in pairs(STATUS_COUNTS) do
    if delta ~= 0 then
      redis.call('HINCRBY', B .. 'stats', field, delta)
    end
  end
  ZSET_CHANGES, STATUS_COUNTS = {}, {}
end

-- Start a call from a clean state: a call that raised may have left deferred writes behind.
local function begin(keys, args)
  KEYS, ARGV, B = keys, args, keys[1]
  local now = args[1]
  REPORT = string.sub(now, 1, 1) == 's'
  if REPORT then
    now = string.sub(now, 2)
  end
  NOW = clock_now(now)
  NOW_S = int_str(NOW)
  SIGNALED, STATUS_COUNTS, ZSET_CHANGES, SETTLED = {}, {}, {}, {}
end

-- Register a script's body (`main`) as the function FUNCTION_PREFIX .. name: its reply is
-- returned after the deferred status writes (`flush_status`) and wake-ups (`publish_signals`),
-- whichever `return` the body took. FUNCTION_PREFIX, like SNAPSHOT_FIELDS, is written above
-- this library by the loader. `flags`: {'no-writes'} for a script that only reads, which Redis
-- then runs when its memory is full (as it ran such an EVAL script) and on replicas.
local function register(name, main, flags)
  redis.register_function {
    function_name = FUNCTION_PREFIX .. name,
    callback = function(keys, args)
      begin(keys, args)
      local reply = main()
      flush_status()
      publish_signals()
      if REPORT then
        return { reply, SETTLED }
      end
      return reply
    end,
    flags = flags or {},
  }
end

-- Move a task from status `from` (nil for a task being created) to `to` in the counters and
-- the status sets (deferred); the caller writes the status field.
local function move_status(id, task_type, created_at, from, to)
  if from then
    count_status(from .. ':' .. task_type, -1)
    index_status(from, id, false)
  end
  count_status(to .. ':' .. task_type, 1)
  index_status(to, id, created_at)
end

-- `move_status` of `t` (id, type, created_at, status; queue too when it enters or leaves
-- blocked: `blocked:<queue>`, which back-pressure counts); the caller also sets `t.status`.
local function recount(t, to)
  move_status(t.id, t.type, t.created_at, t.status, to)
  if to == 'blocked' then
    zset_later(B .. 'blocked:' .. t.queue, t.id, t.created_at)
  elseif t.status == 'blocked' then
    zset_later(B .. 'blocked:' .. t.queue, t.id, false)
  end
end

-- The only place a status changes: counters and the status index move with it.
-- `t.status` may be nil for a task being created. `t` needs id, type, queue, status, created_at.
local function set_status(t, to)
  if t.status then
    leave(t)
  end
  recount(t, to)
  redis.call('HSET', task_key(t.id), 'status', to)
  t.status = to
end

-- Make the task claimable at `run_at` (µs string) and wake waiters of its queue.
-- Give the due task `id` (still in its queue) a lease: running, `token`, until `lease_until`.
-- Returns its snapshot. Every claiming script leases through here.
local function lease_task(id, token, lease_until)
  -- `set_status(t, 'running')` and the lease fields in one HSET; the move from the queue to
  -- the leases set is deferred (see `zset_later`). The snapshot is read once, before the
  -- write, and given the values the write stored; its fields are read where they stand, with
  -- no table of them (a claim leases every task through here). The lease fields, last in a
  -- snapshot (the codec reads them there), are not read: a due task has none, and this sets them.
  local key = task_key(id)
  local v = redis.call('HMGET', key, unpack(SNAPSHOT_FIELDS, 1, AT.token - 1))
  local claims = tostring(tonumber(v[AT.claims]) + 1)
  local p = priority_of(v[AT.priority])
  zset_later(ready_key(v[AT.queue], p), id, false)
  zset_later(due_key(v[AT.queue], v[AT.type], p), id, false)
  move_status(id, v[AT.type], v[AT.created_at], v[AT.status], 'running')
  redis.call('HSET', key, 'status', 'running', 'token', token, 'lease_until', lease_until,
    'started_at', NOW_S, 'claims', claims)
  zset_later(B .. 'leases', id, lease_until)
  v[AT.status], v[AT.token], v[AT.lease_until], v[AT.started_at], v[AT.claims] =
    'running', token, lease_until, NOW_S, claims
  return v
end

local function make_ready(t, to, run_at)
  set_status(t, to)
  redis.call('HSET', task_key(t.id), 'run_at', run_at)
  t.run_at = run_at
  local p = priority_of(t.priority)
  if p ~= '0' then
    note_priority(t.queue, p)
  end
  redis.call('ZADD', ready_key(t.queue, p), run_at, t.id)
  redis.call('ZADD', due_key(t.queue, t.type, p), run_at, t.id)
  signal(t.queue)
end

-- Up to `limit` ids of `queue`'s tasks of one type and priority `p` due now, in claim order,
-- and their run_at (µs) in a second list: read from the type's due set and checked against
-- the priority's ready set (`ready_key`: `queue:<queue>` for 0), which holds the truth, in
-- one ZMSCORE. A build without the due sets (a rolling deploy from
-- one) claims and re-queues tasks through `queue:<queue>` alone: an entry no longer there is
-- dropped here (its task is leased or final), and one whose run_at moved is moved too, so no
-- task is leased twice or early. `skip`: pass over that many first (a walk in chunks that read
-- them already, which dropped or moved the entries no longer due: the ones left are theirs).
local function due_of_type(queue, task_type, limit, skip, p)
  local key, queue_key = due_key(queue, task_type, p), ready_key(queue, p)
  local ids, run_ats, offset = {}, {}, skip or 0
  while #ids < limit do
    local found = redis.call('ZRANGEBYSCORE', key, '-inf', NOW_S, 'LIMIT', offset, limit - #ids)
    if #found == 0 then
      break
    end
    local scores = redis.call('ZMSCORE', queue_key, unpack(found))
    for i, id in ipairs(found) do
      local run_at = scores[i] and tonumber(scores[i])
      if not run_at then
        redis.call('ZREM', key, id)
      elseif run_at <= NOW then
        offset = offset + 1  -- stays in the range read: the next read starts past it
        ids[#ids + 1], run_ats[#run_ats + 1] = id, run_at
      else
        redis.call('ZADD', key, scores[i], id)
      end
    end
  end
  return ids, run_ats
end

-- Whether `queue`'s due sets of priority 0 hold exactly the entries of `queue:<queue>` -- by
-- count, which is all a build keeping both can have made -- and, when not, make them so: a
-- build without the due sets (a rolling deploy from one) stored or re-queued tasks into
-- `queue:<queue>` alone (and knew of no other priority).
-- O(1) per type of the queue when they agree; a walk of the queue when they do not. Returns
-- whether they did not.
local function repair_due_sets(queue)
  local queue_key, types_key = B .. 'queue:' .. queue, B .. 'types:' .. queue
  local names = redis.call('SMEMBERS', types_key)
  local held = 0
  for _, name in ipairs(names) do
    held = held + redis.call('ZCARD', due_key(queue, name, '0'))
  end
  if held == redis.call('ZCARD', queue_key) then
    return false
  end
  for _, name in ipairs(names) do
    local key = due_key(queue, name, '0')
    for _, id in ipairs(redis.call('ZRANGE', key, 0, -1)) do
      if not redis.call('ZSCORE', queue_key, id) then
        redis.call('ZREM', key, id)
      end
    end
  end
  local entries = redis.call('ZRANGE', queue_key, 0, -1, 'WITHSCORES')
  for i = 1, #entries, 2 do
    local id, run_at = entries[i], entries[i + 1]
    local task_type = redis.call('HGET', task_key(id), 'type')
    if task_type then
      redis.call('SADD', types_key, task_type)
      redis.call('ZADD', due_key(queue, task_type, '0'), run_at, id)
    end
  end
  return true
end

-- Up to `limit` ids of `queue`'s tasks of priority `p` due now, oldest due first (run_at,
-- then id), of the types in `types` (as `due_ids`).
local function due_of_priority(queue, types, limit, p)
  if types == '' then
    return redis.call('ZRANGEBYSCORE', ready_key(queue, p), '-inf', NOW_S, 'LIMIT', 0, limit)
  end
  if not string.find(types, '%z') then
    return (due_of_type(queue, types, limit, 0, p))  -- one type: its own order is the claim order
  end
  local due = {}
  for name in string.gmatch(types, '[^%z]+') do
    local found, run_ats = due_of_type(queue, name, limit, 0, p)
    for i, id in ipairs(found) do
      due[#due + 1] = { run_ats[i], id }
    end
  end
  table.sort(due, function(a, b)
    return a[1] < b[1] or (a[1] == b[1] and a[2] < b[2])
  end)
  local ids = {}
  for i = 1, math.min(limit, #due) do
    ids[i] = due[i][2]
  end
  return ids
end

-- Up to `limit` ids of `queue` due now, in claim order -- highest priority first, then oldest
-- due (run_at), then id -- of the types in `types` (NUL-separated; "" for any type). Each
-- priority's sets are read in turn (`priority_levels`); a priority whose ready set is empty is
-- dropped from prios:<queue>. Each type's due set is read from its head, so due tasks of other
-- types never stand in the way. A claim that finds fewer than it may take first checks the
-- due sets against the queue (`repair_due_sets`) and then looks again.
local function due_ids(queue, types, limit, checked)
  local ids
  for _, p in ipairs(priority_levels(queue)) do
    if p ~= '0' and redis.call('EXISTS', ready_key(queue, p)) == 0 then
      redis.call('ZREM', B .. 'prios:' .. queue, p)
    elseif not ids then
      ids = due_of_priority(queue, types, limit, p)
    else
      for _, id in ipairs(due_of_priority(queue, types, limit - #ids, p)) do
        ids[#ids + 1] = id
      end
    end
    if ids and #ids >= limit then
      break
    end
  end
  ids = ids or {}
  if #ids < limit and not checked and types ~= '' and repair_due_sets(queue) then
    return due_ids(queue, types, limit, true)
  end
  return ids
end

-- Status on arrival given the parents' statuses (same rule as the memory broker).
local function arrival_status(depends_on, ignore_parent_failure)
  local verdict = 'pending'
  for _, parent in ipairs(depends_on) do
    local st = redis.call('HGET', task_key(parent), 'status')
    if st == 'failed' or st == 'canceled' then
      if not ignore_parent_failure then
        return 'canceled', 'canceled because parent ' .. parent .. ' ' .. st
      end
    elseif st ~= 'completed' then
      verdict = 'blocked'
    end
  end
  return verdict, nil
end

local function end_task(t, to, fields)
  set_status(t, to)
  redis.call('HSET', task_key(t.id), 'finished_at', NOW_S, unpack(fields))
end

-- After `root` became final: wake its ready children, cancel the broken ones, recursively.
-- Only blocked children move: a child is blocked until every parent is final. A call that
-- reports (`REPORT`) keeps the snapshot of each child it moved, as it is once moved.
local function settle_children(root)
  -- Most tasks have no children: an EXISTS answers that for less than SMEMBERS's empty reply
  -- and the walk's stack.
  if redis.call('EXISTS', B .. 'children:' .. root.id) == 0 then
    return
  end
  local stack = { root }
  while #stack > 0 do
    local parent = table.remove(stack)
    for _, child_id in ipairs(redis.call('SMEMBERS', B .. 'children:' .. parent.id)) do
      local child = load(child_id)
      if child and child.status == 'blocked' then
        local ignore = child.ignore_parent_failure == '1'
        if parent.status == 'completed' or ignore then
          local verdict = arrival_status(cjson.decode(child.depends_on), ignore)
          if verdict == 'pending' then
            make_ready(child, 'pending', child.run_at)
            if REPORT then
              SETTLED[#SETTLED + 1] = snapshot(child_id)
            end
          end
        else
          local why = 'canceled because parent ' .. parent.id .. ' ' .. parent.status
          end_task(child, 'canceled', { 'last_error', why })
          table.insert(stack, child)
          if REPORT then
            SETTLED[#SETTLED + 1] = snapshot(child_id)
          end
        end
      end
    end
  end
end

-- End a task in a final status and settle its descendants, in this same script.
local function finish(t, to, fields)
  end_task(t, to, fields)
  settle_children(t)
end

-- `finish(t, 'completed', ...)` for a task held under a lease (`held_by`): the status and
-- `result` (nil: none) in one HSET, the lease's entry in the leases set removed when the
-- script ends.
local function complete_held(t, result)
  local key = task_key(t.id)
  zset_later(B .. 'leases', t.id, false)
  redis.call('HDEL', key, 'token', 'lease_until')
  recount(t, 'completed')
  if result then
    redis.call('HSET', key, 'status', 'completed', 'finished_at', NOW_S, 'result', result)
  else
    redis.call('HSET', key, 'status', 'completed', 'finished_at', NOW_S)
  end
  t.status = 'completed'
  settle_children(t)
end

-- A task a worker writes to must be running under `token`: `t` (or nil and an error reply).
local function held_by(t, id, token)
  if not t then
    return nil, { 'notfound', id }
  end
  if t.status ~= 'running' or t.token ~= token then
    return nil, { 'leaselost', id, t.status }
  end
  return t, nil
end

-- Load a task a worker writes to (every field); nil and an error reply unless it is held.
local function load_leased(id, token)
  return held_by(load(id), id, token)
end

-- Complete the task `id` held under `token` with `result` (nil: none) and settle its children:
-- {"ok", snapshot} (`quiet`: {"ok"}), or the error reply of a task not held. The snapshot is
-- read once, before the writes, and given the values they stored that a task snapshot shows
-- (the lease fields it drops are not among them; settling writes only the children).
local function ack_held(id, token, result, quiet)
  local v, t, err
  if quiet then
    t, err = held_by(load_held(id), id, token)
  else
    v = snapshot(id)
    t, err = held_by(core_of(v), id, token)
  end
  if not t then
    return err
  end
  complete_held(t, result)
  if quiet then
    return { 'ok' }
  end
  v[AT.status], v[AT.finished_at] = 'completed', NOW_S
  if result then
    v[AT.result] = result
  end
  return { 'ok', v }
end

-- Count a failure by kind: business and skip move attempts, throttled moves throttled.
local function count_failure(t, kind)
  local field = (kind == 'throttled') and 'throttled' or 'attempts'
  redis.call('HINCRBY', task_key(t.id), field, 1)
end

-- The other ends of a run (settle.lua), each for the task `id` held under `token`: nil once
-- done, or the error reply of a task not held (then nothing was written for it).

-- Count the failure by `kind`, store `text` as its error, and make the task `retrying` due
-- `delay` µs from now -- or, when a cancel was requested meanwhile, cancel it (with cascade)
-- instead (the failure still counted and stored).
-- A queue's hold at NOW, as stored ("-1": until resumed); nil when it is not held.
local function queue_hold(queue)
  local held = redis.call('GET', B .. 'hold:' .. queue)
  if held and (held == '-1' or tonumber(held) > NOW) then
    return held
  end
  return nil
end

-- Hold a queue until `until_us` (a string of µs, or "-1": until resumed), keeping a longer hold.
local function extend_hold(queue, until_us)
  local key = B .. 'hold:' .. queue
  local held = redis.call('GET', key)
  if held == '-1' then
    return
  end
  if until_us == '-1' or not held or tonumber(held) < tonumber(until_us) then
    redis.call('SET', key, until_us)
  end
end

-- Store `tb` as the task's last_traceback, or delete the field when it is nil.
local function set_traceback(id, tb)
  if tb then
    redis.call('HSET', task_key(id), 'last_traceback', tb)
  else
    redis.call('HDEL', task_key(id), 'last_traceback')
  end
end

local function retry_held(id, token, kind, text, delay, hold, tb)
  local t, err = load_leased(id, token)
  if not t then
    return err
  end
  if hold == '1' then  -- a queue-wide throttle: the queue is held in the same script
    extend_hold(t.queue, int_str(NOW + tonumber(delay)))
  end
  count_failure(t, kind)
  redis.call('HSET', task_key(id), 'last_error', text)
  set_traceback(id, tb)
  if t.cancel_requested == '1' then
    finish(t, 'canceled', {})
  else
    make_ready(t, 'retrying', int_str(NOW + tonumber(delay)))
  end
end

-- The ULID after `id` (26 Crockford base-32 digits): the same millisecond, the random part one
-- higher -- how a script makes more ids from the one fresh id its caller sent.
local CROCKFORD = '0123456789ABCDEFGHJKMNPQRSTVWXYZ'
local function next_ulid(id)
  local digits = {}
  for i = 1, #id do
    digits[i] = string.find(CROCKFORD, string.sub(id, i, i), 1, true) - 1
  end
  for i = #id, 1, -1 do
    if digits[i] < 31 then
      digits[i] = digits[i] + 1
      break
    end
    digits[i] = 0
  end
  local out = {}
  for i = 1, #digits do
    out[i] = string.sub(CROCKFORD, digits[i] + 1, digits[i] + 1)
  end
  return table.concat(out)
end

-- Submit the compensation of the task `failed_id`, just failed by this script: a new task of
-- `comp_type` in `queue`, payload {"failed": failed_id}, no parents, pending and due now, under
-- `id` or (taken already) the next free ULID after it. Returns the id used.
local function store_compensation(id, comp_type, queue, max_retry, failed_id)
  while redis.call('EXISTS', task_key(id)) == 1 do
    id = next_ulid(id)
  end
  redis.call('HSET', task_key(id), 'id', id, 'type', comp_type, 'queue', queue, 'created_at', NOW_S,
    'run_at', NOW_S, 'attempts', '0', 'max_retry', max_retry, 'throttled', '0', 'lease_lost', '0',
    'claims', '0', 'depends_on', '[]', 'ignore_parent_failure', '0', 'cancel_requested', '0',
    'status', 'pending', 'payload', cjson.encode({ failed = failed_id }))
  redis.call('SADD', B .. 'types:' .. queue, comp_type)
  zset_later(B .. 'idx:all', id, NOW_S)
  zset_later(B .. 'idx:type:' .. comp_type, id, NOW_S)
  zset_later(B .. 'idx:queue:' .. queue, id, NOW_S)
  move_status(id, comp_type, NOW_S, nil, 'pending')
  redis.call('ZADD', ready_key(queue, '0'), NOW_S, id)  -- of priority 0, as a new task by default
  redis.call('ZADD', due_key(queue, comp_type, '0'), NOW_S, id)
  signal(queue)
  return id
end

-- Count the failure by `kind`, store `text` as its error (and `tb` as its traceback), and
-- fail the task for good (its descendants canceled).
local function fail_held(id, token, kind, text, tb, comp)
  local t, err = load_leased(id, token)
  if not t then
    return err
  end
  count_failure(t, kind)
  set_traceback(id, tb)
  finish(t, 'failed', { 'last_error', text })
  if comp then  -- {id, type, queue, max_retry}: the compensation, in this same script
    store_compensation(comp[1], comp[2], comp[3], comp[4], id)
  end
end

-- Put the task back to `pending`, due now, touching no counter (graceful shutdown) -- or,
-- when a cancel was requested meanwhile, cancel it (with cascade) instead.
local function requeue_held(id, token)
  local t, err = load_leased(id, token)
  if not t then
    return err
  end
  if t.cancel_requested == '1' then
    finish(t, 'canceled', CANCELED_ERROR)
  else
    make_ready(t, 'pending', NOW_S)
  end
end

-- End a run its handler stopped for a cancel: `canceled`, with its descendants.
local function cancel_held(id, token)
  local t, err = load_leased(id, token)
  if not t then
    return err
  end
  finish(t, 'canceled', CANCELED_ERROR)
end

-- ---------------------------------------------------------------------------------------

-- GCRA of a queue's start rate (claim_limited.lua): take up to n starts from the limiter at
-- `key` (rate `rps`, `burst`). GCRA keeps one number, the theoretical arrival time (TAT):
-- each start pushes it one emission interval T = 1/rps further; a start is allowed while
-- TAT - now <= burst * T, i.e. at most `burst` starts at once and `rps` per second after
-- that. The key expires once its TAT lies in the past. Returns granted, and the wait in
-- seconds before the next start may be allowed when fewer than n were granted (0 otherwise).
local function gcra_take(key, rps, burst, n)
  local interval = 1000000 / rps
  local tat = math.max(tonumber(redis.call('GET', key) or '0'), NOW)
  local room = math.floor((NOW + burst * interval - tat) / interval + 1e-9)
  local granted = math.max(0, math.min(n, room))
  tat = tat + granted * interval
  local retry_after = 0
  if granted < n then
    -- the next start is allowed once TAT - later <= (burst - 1) * T
    retry_after = math.max(0, tat - (burst - 1) * interval - NOW) / 1000000
  end
  if granted > 0 then
    redis.call('SET', key, string.format('%.3f', tat), 'PX', math.ceil((tat - NOW) / 1000) + 60000)
  end
  return granted, retry_after
end

-- A quota key's current window (claim_quota.lua, claim_limited.lua): windows are aligned to
-- the Unix epoch on the broker's clock and only the newest is kept, so a clock that steps back
-- into a forgotten window gets no unit (fewer issued, never more). Returns the window start
-- (µs), the units used in it, the units left, and whether the window is a forgotten one (then
-- nothing is left, and nothing may be written).
local function quota_window(key, limit, period)
  local start = math.floor(NOW / period) * period
  local kept = tonumber(redis.call('HGET', key, 'start') or '-1')
  if start < kept then
    return start, 0, 0, true
  end
  local used = 0
  if start == kept then
    used = tonumber(redis.call('HGET', key, 'used') or '0')
  end
  return start, used, math.max(0, limit - used), false
end

-- ---------------------------------------------------------------------------------------
-- Group limits (claim_limited.lua, only when a group limit is set): each group of a queue
-- (a task's `group` field) holds at most `workers` of the queue's slots, starts at `rps` with
-- bursts of `burst` (GCRA, as the queue's), and `quota` starts per epoch-aligned `period`.
-- A group's slots are the queue's own (slots:<queue>, renewed by heartbeat.lua and given back
-- by settle.lua and the next claim as ever), joined to their group by slot_groups:<queue>:
-- nothing else needs to know about groups, and a slot that expires, or is given back, stops
-- counting for its group at once.

-- How many due candidates a grouped claim looks at, at most, and how many it reads first
-- (then twice as many each time: a claim whose first candidates have room reads no more).
-- See claim_limited.lua for why a cap, and why this one.
local GROUP_WALK_CAP = 2000
local GROUP_WALK_FIRST = 64

-- A group's key of `kind` in `queue` (<n>: the queue name's length, so the key is unambiguous).
local function group_key(kind, queue, group)
  return B .. kind .. ':' .. #queue .. ':' .. queue .. ':' .. group
end

-- The group limits as claim_limited.lua takes them ("workers rps burst quota period_us";
-- 0 where unset), or nil for "" (no group limit).
local function group_limits(text)
  if text == '' then
    return nil
  end
  local v = {}
  for word in string.gmatch(text, '%S+') do
    v[#v + 1] = tonumber(word)
  end
  return { workers = v[1], rps = v[2], burst = math.max(v[3], 1), quota = v[4], period = v[5] }
end

-- Drop the entries of slot_groups:<queue> whose slot is no longer held, once they outnumber
-- the held ones: amortized O(1) per slot a grouped claim took (the expired and given-back
-- slots leave their entries behind: neither settle.lua nor heartbeat.lua knows of groups).
local function prune_slot_groups(queue)
  local map, slots = B .. 'slot_groups:' .. queue, B .. 'slots:' .. queue
  if redis.call('HLEN', map) <= 2 * redis.call('ZCARD', slots) + 64 then
    return
  end
  local tokens = redis.call('HKEYS', map)
  local gone = {}
  for first = 1, #tokens, VARIADIC_CHUNK do
    local last = math.min(first + VARIADIC_CHUNK - 1, #tokens)
    local scores = redis.call('ZMSCORE', slots, unpack(tokens, first, last))
    for i = first, last do
      if not scores[i - first + 1] then
        gone[#gone + 1] = tokens[i]
      end
    end
  end
  call_chunked('HDEL', map, gone)
end

-- How many of `queue`'s slots each group holds: its live slots (the expired ones are purged
-- already) joined to their groups. O(slots held), read once per claim.
local function group_slots_held(queue)
  local tokens = redis.call('ZRANGE', B .. 'slots:' .. queue, 0, -1)
  local map, held = B .. 'slot_groups:' .. queue, {}
  for first = 1, #tokens, VARIADIC_CHUNK do
    local last = math.min(first + VARIADIC_CHUNK - 1, #tokens)
    local groups = redis.call('HMGET', map, unpack(tokens, first, last))
    for _, group in ipairs(groups) do
      if group then
        held[group] = (held[group] or 0) + 1
      end
    end
  end
  return held
end

-- One group's room in this claim: how many of its tasks may start now, and what its rate and
-- quota stand at (to write back what the claim took: `spend_group`).
local function group_state(limits, queue, group, held)
  local state = { room = math.huge }
  if limits.workers > 0 then
    state.room = limits.workers - (held[group] or 0)
  end
  if limits.rps > 0 then
    local interval = 1000000 / limits.rps
    local stored = redis.call('GET', group_key('group_rate', queue, group))
    state.tat = math.max(tonumber(stored or '0'), NOW)
    local room = math.floor((NOW + limits.burst * interval - state.tat) / interval + 1e-9)
    state.room = math.min(state.room, math.max(0, room))
  end
  if limits.quota > 0 then
    local left
    state.start, state.used, left, state.forgotten =
      quota_window(group_key('group_quota', queue, group), limits.quota, limits.period)
    state.room = math.min(state.room, left)
  end
  return state
end

-- The due candidates of `queue` (of `types`, see `due_ids`) from the `seen + 1`th to the
-- `upto`th, in claim order: a list holding them from its `from`th entry on, and how many
-- candidates there are up to the last one read (fewer than `upto`: no more are due).
local function due_chunk(queue, types, seen, upto)
  if redis.call('EXISTS', B .. 'prios:' .. queue) == 1 then  -- several priorities: from the head
    local found = due_ids(queue, types, upto)
    return found, seen + 1, #found
  end
  if types == '' then  -- the next chunk alone
    local found = redis.call('ZRANGEBYSCORE', B .. 'queue:' .. queue, '-inf', NOW_S, 'LIMIT', seen,
      upto - seen)
    return found, 1, seen + #found
  end
  if seen > 0 and not string.find(types, '%z') then  -- one type's next chunk alone
    local found = due_of_type(queue, types, upto - seen, seen, '0')
    return found, 1, seen + #found
  end
  -- From the head: the first chunk (`due_ids` checks the due sets), or several types' sets
  -- merged again (about three times the reads of one pass, over the whole walk).
  local found = due_ids(queue, types, upto)
  return found, seen + 1, #found
end

-- Up to `limit` ids of `queue` due now (of `types`), in claim order, passing over those of a
-- group without room, and the group of each (false: none). Reads the due candidates in
-- growing chunks and looks at GROUP_WALK_CAP of them at most. `states` (group ->
-- `group_state`) is filled for every group met; its rooms are what the picks left.
local function due_with_room(limits, queue, types, limit, held, states)
  local ids, groups = {}, {}
  local seen, size = 0, math.max(limit, GROUP_WALK_FIRST)
  while #ids < limit and seen < GROUP_WALK_CAP do
    local upto = math.min(seen + size, GROUP_WALK_CAP)
    local found, from, read = due_chunk(queue, types, seen, upto)
    for i = from, #found do
      local group = redis.call('HGET', task_key(found[i]), 'group')
      local state = group and states[group]
      if group and not state then
        state = group_state(limits, queue, group, held)
        states[group] = state
      end
      if not group or state.room > 0 then
        ids[#ids + 1], groups[#groups + 1] = found[i], group or false
        if state then
          state.room = state.room - 1
        end
        if #ids == limit then
          break
        end
      end
    end
    if read < upto then
      break  -- nothing more is due
    end
    seen, size = upto, size * 2
  end
  return ids, groups
end

-- Write what a claim took of a group's limits: `n` starts of its rate and of its quota window.
-- The quota's key is kept one period past its window (then the group starts afresh).
local function spend_group(limits, queue, group, state, n)
  if limits.rps > 0 then
    local tat = state.tat + n * 1000000 / limits.rps
    redis.call('SET', group_key('group_rate', queue, group), string.format('%.3f', tat),
      'PX', math.ceil((tat - NOW) / 1000) + 60000)
  end
  if limits.quota > 0 and not state.forgotten then
    local key = group_key('group_quota', queue, group)
    redis.call('HSET', key, 'start', int_str(state.start), 'used', int_str(state.used + n))
    redis.call('PEXPIRE', key, math.ceil((state.start + 2 * limits.period - NOW) / 1000))
  end
end

-- What a grouped claim took, written: the first `n` of its picks (`due_with_room`: `groups`,
-- the group of each) were leased under the tokens ARGV[first_token..]; each grouped one's slot
-- is mapped to its group, and each group's rate and quota spent once for all its starts.
local function spend_groups(limits, queue, states, groups, args, first_token, n)
  local taken, mapped = {}, {}
  for i = 1, n do
    local group = groups[i]
    if group then
      taken[group] = (taken[group] or 0) + 1
      mapped[#mapped + 1] = args[first_token - 1 + i]
      mapped[#mapped + 1] = group
    end
  end
  call_chunked('HSET', B .. 'slot_groups:' .. queue, mapped)
  for group, count in pairs(taken) do
    spend_group(limits, queue, group, states[group], count)
  end
end
