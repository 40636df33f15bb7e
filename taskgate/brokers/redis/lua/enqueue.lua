-- enqueue.lua: store a batch of new tasks, all or nothing.
--
-- KEYS[1]  base (hash-tagged prefix, e.g. "tg:{tg}:")
-- ARGV[1]  now in µs, or "" for the server's TIME
-- ARGV[2]  number of tasks N
-- ARGV[3]  shape: "rows": then N groups of 16 values, one per task, in batch order:
--          id, type, queue, has_payload (0/1), payload, max_retry, run_at (µs or ""),
--          delay (µs or ""), ignore_parent_failure (0/1), has_business_key (0/1),
--          business_key, depends_on (JSON array of ids), timeout (ms or "" for none),
--          group ("" for none), trace_context ("" for none), priority (an integer);
--          "shared": then one group of 16 whose every value but id and payload is every
--          task's (has_business_key 0), then N groups of 3: id, has_payload (0/1), payload;
--          after the tasks, optionally (back-pressure, `Submit.max_pending`): M, then M pairs
--          queue, limit
-- Returns  {"ok", created_at (µs), arrival...} with one {status, run_at (µs), last_error or ""}
--          per task, in batch order (every other field is what the caller sent), or
--          {"ok", created_at, "alike", N, arrival} when all N tasks arrived alike; or
--          {"duplicate", id}                 an id exists already or twice in the batch
--          {"exists", key, newest_id, status} a business key is used already
--          {"dupkey", key}                    a business key appears twice in the batch
--          {"notfound", parent_id}            a parent neither exists nor comes earlier
--          {"full", queue, limit, waiting, adding}  the batch would take a limited queue past
--                                             its limit
--
-- Touches: task:<id> HASH (write), task:<parent> HASH (read), children:<parent> SET,
--          bkey:<key> LIST, stats HASH, idx:all / idx:type:<t> / idx:queue:<q> /
--          idx:status:<s> / idx:group:<g> ZSET, queue:<q> ZSET, due:<n>:<q>:<type> ZSET,
--          pqueue:<p>:<q> ZSET, pdue:<p>:<n>:<q>:<type> ZSET, prios:<q> ZSET, types:<q> SET,
--          blocked:<q> ZSET, signal:<q> channel (PUBLISH).

local FIELDS = 16

local function read_rows(count)
  local batch = {}
  for i = 0, count - 1 do
    local a = 4 + i * FIELDS
    batch[#batch + 1] = {
      id = ARGV[a], type = ARGV[a + 1], queue = ARGV[a + 2],
      has_payload = ARGV[a + 3] == '1', payload = ARGV[a + 4], max_retry = ARGV[a + 5],
      run_at = ARGV[a + 6], delay = ARGV[a + 7], ignore = ARGV[a + 8],
      has_key = ARGV[a + 9] == '1', key = ARGV[a + 10], depends_on = ARGV[a + 11],
      timeout = ARGV[a + 12], group = ARGV[a + 13], trace = ARGV[a + 14],
      priority = ARGV[a + 15],
    }
  end
  return batch
end

local function read_shared(count)
  local t = 4  -- the template
  local batch = {}
  for i = 0, count - 1 do
    local a = t + FIELDS + i * 3
    batch[#batch + 1] = {
      id = ARGV[a], type = ARGV[t + 1], queue = ARGV[t + 2],
      has_payload = ARGV[a + 1] == '1', payload = ARGV[a + 2], max_retry = ARGV[t + 5],
      run_at = ARGV[t + 6], delay = ARGV[t + 7], ignore = ARGV[t + 8],
      has_key = false, key = '', depends_on = ARGV[t + 11], timeout = ARGV[t + 12],
      group = ARGV[t + 13], trace = ARGV[t + 14], priority = ARGV[t + 15],
    }
  end
  return batch
end

-- Where the tasks' values end in ARGV: the limits, if any, come next.
local function tasks_end(count)
  if ARGV[3] == 'shared' then
    return 4 + FIELDS + count * 3
  end
  return 4 + count * FIELDS
end

-- Back-pressure: each limited queue the batch adds to (`adding`: queue -> tasks) may hold at
-- most its limit of waiting tasks -- pending and retrying (`ready_count`), blocked (blocked:<q>)
-- -- counting the batch's own. The limits are at ARGV[at..]; a call without any pays one look.
local function check_room(adding, at)
  local m = ARGV[at]
  if not m then
    return nil
  end
  for i = 1, tonumber(m) do
    local queue, limit = ARGV[at + 2 * i - 1], tonumber(ARGV[at + 2 * i])
    local n = adding[queue]
    if n then
      local waiting = ready_count(queue) + redis.call('ZCARD', B .. 'blocked:' .. queue)
      if waiting + n > limit then
        return { 'full', queue, limit, math.min(waiting, limit), n }  -- counted up to the limit, as SQL
      end
    end
  end
  return nil
end

local function read_batch()
  local count = tonumber(ARGV[2])
  if ARGV[3] == 'shared' then
    return read_shared(count)
  end
  return read_rows(count)
end

-- Every check before any write: a failed check leaves the store untouched.
local function check(batch)
  local ids, keys = {}, {}
  for _, n in ipairs(batch) do
    if ids[n.id] or redis.call('EXISTS', task_key(n.id)) == 1 then
      return { 'duplicate', n.id }
    end
    if n.has_key then
      local newest = redis.call('LINDEX', B .. 'bkey:' .. n.key, -1)
      if newest then
        return { 'exists', n.key, newest, redis.call('HGET', task_key(newest), 'status') }
      end
      if keys[n.key] then
        return { 'dupkey', n.key }
      end
      keys[n.key] = n.id
    end
    if n.depends_on ~= '[]' then
      for _, parent in ipairs(cjson.decode(n.depends_on)) do
        if not ids[parent] and redis.call('EXISTS', task_key(parent)) == 0 then
          return { 'notfound', parent }
        end
      end
    end
    ids[n.id] = true
  end
  return nil
end

local function due_at(n)
  if n.run_at ~= '' then
    return n.run_at
  end
  if n.delay ~= '' then
    return int_str(NOW + tonumber(n.delay))
  end
  return NOW_S
end

-- The batch's sorted-set entries and counters are deferred (`zset_later`, `count_status`):
-- written once per key when the script ends, not one call per task and key. The task hashes
-- are written at once, so a later task of the batch reads its parents' statuses from them.

local NO_PARENTS = {}
local KNOWN_TYPES = {}  -- "<queue>\0<type>" already added to types:<queue> by this call

local function store(n)
  local key = task_key(n.id)
  local run_at = due_at(n)
  local parents = NO_PARENTS
  if n.depends_on ~= '[]' then
    parents = cjson.decode(n.depends_on)
  end
  local status, err = arrival_status(parents, n.ignore == '1')
  redis.call('HSET', key, 'id', n.id, 'type', n.type, 'queue', n.queue, 'created_at', NOW_S,
    'run_at', run_at, 'attempts', '0', 'max_retry', n.max_retry, 'throttled', '0',
    'lease_lost', '0', 'claims', '0', 'depends_on', n.depends_on,
    'ignore_parent_failure', n.ignore, 'cancel_requested', '0', 'status', status)
  if n.has_payload then
    redis.call('HSET', key, 'payload', n.payload)
  end
  if n.timeout ~= '' then
    redis.call('HSET', key, 'timeout_ms', n.timeout)
  end
  if n.trace ~= '' then
    redis.call('HSET', key, 'trace_context', n.trace)
  end
  if n.priority ~= '0' then  -- absent: 0, as on every task stored before priorities
    redis.call('HSET', key, 'priority', n.priority)
  end
  if n.group ~= '' then
    redis.call('HSET', key, 'group', n.group)
    zset_later(B .. 'idx:group:' .. n.group, n.id, NOW_S)
  end
  if n.has_key then
    redis.call('HSET', key, 'business_key', n.key)
    redis.call('RPUSH', B .. 'bkey:' .. n.key, n.id)
  end
  for _, parent in ipairs(parents) do
    redis.call('SADD', B .. 'children:' .. parent, n.id)
  end
  local queue_type = n.queue .. '\0' .. n.type
  if not KNOWN_TYPES[queue_type] then
    KNOWN_TYPES[queue_type] = true
    redis.call('SADD', B .. 'types:' .. n.queue, n.type)
  end
  zset_later(B .. 'idx:all', n.id, NOW_S)
  zset_later(B .. 'idx:type:' .. n.type, n.id, NOW_S)
  zset_later(B .. 'idx:queue:' .. n.queue, n.id, NOW_S)
  recount({ id = n.id, type = n.type, queue = n.queue, created_at = NOW_S }, status)  -- the hash has its status
  if status == 'pending' then
    if n.priority ~= '0' then
      note_priority(n.queue, n.priority)
    end
    zset_later(ready_key(n.queue, n.priority), n.id, run_at)
    zset_later(due_key(n.queue, n.type, n.priority), n.id, run_at)
    signal(n.queue)
  elseif status == 'canceled' then
    redis.call('HSET', key, 'finished_at', NOW_S, 'last_error', err)
  end
  return { status, run_at, err or '' }
end

-- Tasks without parents or business key that differ only in id and payload (the "shared"
-- shape of `submit_many`, or one task alone): every task arrives pending, due at the same
-- time, in the same sets. The per-task work is the id check, one HSET and the set entries,
-- with no table per task: the general path below costs a third more. The template of the
-- shared fields is at ARGV[4..19]; task i (0-based) has its id at ARGV[first + i * stride],
-- its has_payload flag (0/1) `flag` and its payload `payload` places after that.
local function store_plain(count, first, stride, flag, payload)
  local t = 4  -- the template
  local task_type, queue = ARGV[t + 1], ARGV[t + 2]
  local max_retry, ignore = ARGV[t + 5], ARGV[t + 8]
  local run_at = due_at({ run_at = ARGV[t + 6], delay = ARGV[t + 7] })
  local seen = {}
  for i = 0, count - 1 do
    local id = ARGV[first + i * stride]
    if seen[id] or redis.call('EXISTS', task_key(id)) == 1 then
      return { 'duplicate', id }
    end
    seen[id] = true
  end
  local full = check_room({ [queue] = count }, tasks_end(count))
  if full then
    return full
  end
  local function write(id, ...)  -- ...: 'payload', <bytes>; or nothing for a task without one
    redis.call('HSET', task_key(id), 'id', id, 'type', task_type, 'queue', queue,
      'created_at', NOW_S, 'run_at', run_at, 'attempts', '0', 'max_retry', max_retry,
      'throttled', '0', 'lease_lost', '0', 'claims', '0', 'depends_on', '[]',
      'ignore_parent_failure', ignore, 'cancel_requested', '0', 'status', 'pending', ...)
  end
  local timeout, group, trace, priority = ARGV[t + 12], ARGV[t + 13], ARGV[t + 14], ARGV[t + 15]
  if timeout ~= '' then  -- the batch's timeout, set once here rather than tested per task
    local untimed = write
    write = function(id, ...)
      untimed(id, 'timeout_ms', timeout, ...)
    end
  end
  if trace ~= '' then  -- the batch's trace context, likewise
    local untraced = write
    write = function(id, ...)
      untraced(id, 'trace_context', trace, ...)
    end
  end
  if priority ~= '0' then  -- the batch's priority, likewise
    local unprioritized = write
    write = function(id, ...)
      unprioritized(id, 'priority', priority, ...)
    end
    note_priority(queue, priority)
  end
  local indexes = { 'idx:all', 'idx:type:' .. task_type, 'idx:queue:' .. queue, 'idx:status:pending' }
  if group ~= '' then  -- the batch's group, likewise
    local ungrouped = write
    write = function(id, ...)
      ungrouped(id, 'group', group, ...)
    end
    indexes[#indexes + 1] = 'idx:group:' .. group
  end
  local created, due = {}, {}
  for i = 0, count - 1 do
    local a = first + i * stride
    local id = ARGV[a]
    if ARGV[a + flag] == '1' then
      write(id, 'payload', ARGV[a + payload])
    else
      write(id)
    end
    created[#created + 1] = NOW_S
    created[#created + 1] = id
    due[#due + 1] = run_at
    due[#due + 1] = id
  end
  for _, index in ipairs(indexes) do
    call_chunked('ZADD', B .. index, created)
  end
  call_chunked('ZADD', ready_key(queue, priority), due)
  call_chunked('ZADD', due_key(queue, task_type, priority), due)
  redis.call('SADD', B .. 'types:' .. queue, task_type)
  count_status('pending:' .. task_type, count)
  signal(queue)
  -- One arrival for all: a reply of N alike arrays costs the server and the client more
  -- than the rest of the answer.
  return { 'ok', NOW_S, 'alike', count, { 'pending', run_at, '' } }
end

if ARGV[4 + 11] == '[]' then
  local count = tonumber(ARGV[2])
  if ARGV[3] == 'shared' then
    return store_plain(count, 4 + FIELDS, 3, 1, 2)  -- after the template: (id, has_payload, payload)
  end
  if count == 1 and ARGV[4 + 9] == '0' then  -- one row without a business key: its own template
    return store_plain(1, 4, FIELDS, 3, 4)
  end
end
local batch = read_batch()
local problem = check(batch)
if problem then
  return problem
end
if ARGV[tasks_end(#batch)] then  -- limits given
  local adding = {}
  for _, n in ipairs(batch) do
    adding[n.queue] = (adding[n.queue] or 0) + 1
  end
  problem = check_room(adding, tasks_end(#batch))
  if problem then
    return problem
  end
end
-- A compact answer: sending back 1000 full hashes costs more than storing them.
local reply = { 'ok', NOW_S }
for _, n in ipairs(batch) do
  reply[#reply + 1] = store(n)
end
return reply
