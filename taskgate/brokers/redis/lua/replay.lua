-- replay.lua: create a new execution re-running a final one, atomically with the checks.
-- The new execution copies type, queue, max_retry, timeout, group, business key, parents and
-- (unless given) payload; replay_of points at the old one; its status follows the enqueue rule.
-- The old task's hash never changes: the chain link is kept in the `replays` HASH.
--
-- KEYS[1]  base (hash-tagged prefix)
-- ARGV[1]  now in µs, or "" for the server's TIME
-- ARGV[2]  old execution id
-- ARGV[3]  new execution id
-- ARGV[4]  allow_completed (0/1)
-- ARGV[5]  payload mode: "keep" (copy the old payload), "none" or "bytes"
-- ARGV[6]  payload bytes (used when mode is "bytes")
-- Returns  {"ok", snapshot}; or, checked in this order, {"notfound", id};
--          {"notfinal", id, status}; {"replayed", id, newer_id}; {"completed", id};
--          {"duplicate", new_id}
--
-- Touches: task:<old> HASH (read), task:<new> HASH, replays HASH, bkey:<key> LIST,
--          children:<parent> SET, task:<parent> HASH (read), stats HASH, idx:all /
--          idx:type:<t> / idx:queue:<q> / idx:status:<s> ZSET, queue:<q> ZSET,
--          signal:<q> channel (PUBLISH).

local old_id, new_id = ARGV[2], ARGV[3]

local function check(old)
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

local function copy(old)
  local key = task_key(new_id)
  redis.call('HSET', key, 'id', new_id, 'type', old.type, 'queue', old.queue, 'created_at', NOW_S,
    'run_at', NOW_S, 'attempts', '0', 'max_retry', old.max_retry, 'throttled', '0',
    'lease_lost', '0', 'claims', '0', 'depends_on', old.depends_on,
    'ignore_parent_failure', old.ignore_parent_failure, 'cancel_requested', '0',
    'replay_of', old_id)
  local mode = ARGV[5]
  if mode == 'bytes' then
    redis.call('HSET', key, 'payload', ARGV[6])
  elseif mode == 'keep' and old.payload then
    redis.call('HSET', key, 'payload', old.payload)
  end
  if old.timeout_ms then
    redis.call('HSET', key, 'timeout_ms', old.timeout_ms)
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

local function index(old)
  local parents = cjson.decode(old.depends_on)
  for _, parent in ipairs(parents) do
    redis.call('SADD', B .. 'children:' .. parent, new_id)
  end
  redis.call('ZADD', B .. 'idx:all', NOW_S, new_id)
  redis.call('ZADD', B .. 'idx:type:' .. old.type, NOW_S, new_id)
  redis.call('ZADD', B .. 'idx:queue:' .. old.queue, NOW_S, new_id)
  local t = { id = new_id, type = old.type, queue = old.queue, created_at = NOW_S }
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

local old = load(old_id)
local problem = check(old)
if problem then
  return problem
end
copy(old)
index(old)
redis.call('HSET', B .. 'replays', old_id, new_id)
return { 'ok', snapshot(new_id) }
