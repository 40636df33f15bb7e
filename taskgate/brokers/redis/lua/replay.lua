-- replay.lua: create a new execution re-running a final one -- and, in the same step, new
-- executions of descendants of it -- atomically with the checks (all made before anything is
-- written). A new execution copies type, queue, max_retry, timeout, group, business key,
-- parents and payload (the first's unless given); replay_of points at the old one; its status
-- follows the enqueue rule. A descendant's parents re-run here are replaced by their new
-- executions (so it waits for them); its other parents stay. The old tasks' hashes never
-- change: the chain links are kept in the `replays` HASH.
--
-- KEYS[1]  base (hash-tagged prefix)
-- ARGV[1]  now in µs, or "" for the server's TIME
-- ARGV[2]  old execution id
-- ARGV[3]  new execution id
-- ARGV[4]  allow_completed (0/1)
-- ARGV[5]  payload mode: "keep" (copy the old payload), "none" or "bytes"
-- ARGV[6]  payload bytes (used when mode is "bytes")
-- ARGV[7..] pairs: old id, new id of each descendant to re-run, each after its parents
-- Returns  {"ok", snapshot of the first}; or, checked in this order for each execution in
--          turn, {"notfound", id}; {"notfinal", id, status}; {"replayed", id, newer_id};
--          {"completed", id}; {"duplicate", new_id}; then {"order", id} for a descendant
--          listed before a parent of it
--
-- Touches: task:<old> HASH (read), task:<new> HASH, replays HASH, bkey:<key> LIST,
--          children:<parent> SET, task:<parent> HASH (read), stats HASH, idx:all /
--          idx:type:<t> / idx:queue:<q> / idx:status:<s> ZSET, queue:<q> ZSET,
--          signal:<q> channel (PUBLISH).

local runs = { { ARGV[2], ARGV[3] } }
for i = 7, #ARGV, 2 do
  runs[#runs + 1] = { ARGV[i], ARGV[i + 1] }
end
local new_of = {}  -- old id -> new id, for every execution re-run here
for _, run in ipairs(runs) do
  new_of[run[1]] = run[2]
end

local function check(old_id, new_id, old)
  if not old then
    return { 'notfound', old_id }
  end
  if not FINAL[old.status] then
    return { 'notfinal', old_id, old.status }
  end
  local newer = redis.call('HGET', B .. 'replays', old_id)
  if newer then
    return { 'replayed', old_id, newer }
  end
  if old.status == 'completed' and ARGV[4] ~= '1' then
    return { 'completed', old_id }
  end
  if redis.call('EXISTS', task_key(new_id)) == 1 then
    return { 'duplicate', new_id }
  end
  return nil
end

-- The parents of the new execution of `old` -- those re-run here by their new executions --
-- and their JSON (the old text when none changed: cjson writes an empty list as an object).
-- Returns nil, nil, the error reply when one of them is listed later than `old`.
local function parents_of(old, made)
  local parents, changed = {}, false
  for n, parent in ipairs(cjson.decode(old.depends_on)) do
    local new_parent = new_of[parent]
    if new_parent then
      if not made[new_parent] then
        return nil, nil, { 'order', old.id }
      end
      parents[n], changed = new_parent, true
    else
      parents[n] = parent
    end
  end
  return parents, changed and cjson.encode(parents) or old.depends_on, nil
end

local function copy(old_id, new_id, old, depends_on, first)
  local key = task_key(new_id)
  redis.call('HSET', key, 'id', new_id, 'type', old.type, 'queue', old.queue, 'created_at', NOW_S,
    'run_at', NOW_S, 'attempts', '0', 'max_retry', old.max_retry, 'throttled', '0',
    'lease_lost', '0', 'claims', '0', 'depends_on', depends_on,
    'ignore_parent_failure', old.ignore_parent_failure, 'cancel_requested', '0',
    'replay_of', old_id)
  local mode = first and ARGV[5] or 'keep'
  if mode == 'bytes' then
    redis.call('HSET', key, 'payload', ARGV[6])
  elseif mode == 'keep' and old.payload then
    redis.call('HSET', key, 'payload', old.payload)
  end
  if old.timeout_ms then
    redis.call('HSET', key, 'timeout_ms', old.timeout_ms)
  end
  if old.priority then
    redis.call('HSET', key, 'priority', old.priority)
  end
  if old.group then
    redis.call('HSET', key, 'group', old.group)
    redis.call('ZADD', B .. 'idx:group:' .. old.group, NOW_S, new_id)
  end
  if old.business_key then
    redis.call('HSET', key, 'business_key', old.business_key)
    redis.call('RPUSH', B .. 'bkey:' .. old.business_key, new_id)
  end
end

local function index(new_id, old, parents)
  for _, parent in ipairs(parents) do
    redis.call('SADD', B .. 'children:' .. parent, new_id)
  end
  redis.call('ZADD', B .. 'idx:all', NOW_S, new_id)
  redis.call('ZADD', B .. 'idx:type:' .. old.type, NOW_S, new_id)
  redis.call('ZADD', B .. 'idx:queue:' .. old.queue, NOW_S, new_id)
  local t = { id = new_id, type = old.type, queue = old.queue, created_at = NOW_S, priority = old.priority }
  local status, err = arrival_status(parents, old.ignore_parent_failure == '1')
  if status == 'pending' then
    make_ready(t, 'pending', NOW_S)
  elseif status == 'canceled' then
    set_status(t, 'canceled')
    redis.call('HSET', task_key(new_id), 'finished_at', NOW_S, 'last_error', err)
  else
    set_status(t, status)
  end
end

local olds, parents, encoded, made = {}, {}, {}, {}
for n, run in ipairs(runs) do
  local old = load(run[1])
  local problem = check(run[1], run[2], old)
  if problem then
    return problem
  end
  olds[n] = old
end
for n, run in ipairs(runs) do
  local problem
  parents[n], encoded[n], problem = parents_of(olds[n], made)
  if problem then
    return problem
  end
  made[run[2]] = true
end
for n, run in ipairs(runs) do
  copy(run[1], run[2], olds[n], encoded[n], n == 1)
  index(run[2], olds[n], parents[n])
  redis.call('HSET', B .. 'replays', run[1], run[2])
end
return { 'ok', snapshot(ARGV[3]) }
