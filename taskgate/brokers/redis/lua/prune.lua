-- prune.lua: delete final tasks (`Broker.prune`): those of the given statuses that finished at
-- or before now - older_than and match the filter, oldest created first, at most `limit` --
-- never one with a child that is not final, nor one replayed by an execution still stored.
-- Each goes with every key entry naming it: its hash, its durable steps, its children set, its
-- entry in each parent's children set, its index entries, its business key's list (a list left empty is
-- gone: the key is free again) and its replay link.
--
-- Candidates come from each status's `idx:status:<s>` in created_at order, up to the cutoff
-- (a task finishes after it was created); at most `4 * limit + 1000` entries are looked at per
-- status, so tasks kept at the head of a status (parents of tasks still to run, tasks of other
-- queues, tasks created long before they finished) can hide older-finished ones behind them
-- from one call: bounded work per call, at the cost of such a backlog waiting.
--
-- KEYS[1]  base (hash-tagged prefix)
-- ARGV[1]  now in µs, or "" for the server's TIME
-- ARGV[2]  older_than in µs
-- ARGV[3]  limit: the most tasks deleted
-- ARGV[4]  type, "" for any
-- ARGV[5]  group, "" for any
-- ARGV[6]  number Q of queues (0: any queue), then the Q queue names
-- then     number E of queues excluded, then the E queue names
-- then     the statuses to delete (each final)
-- Returns  {"ok", deleted}
--
-- Touches: task:<id> HASH (read, DEL), steps:<id> HASH (DEL), children:<id> SET (read, DEL,
--          SREM), replays HASH,
--          bkey:<key> LIST (LREM), stats HASH, idx:all / idx:type:<t> / idx:queue:<q> /
--          idx:status:<s> / idx:group:<g> ZSET.

local cutoff = NOW - tonumber(ARGV[2])
local limit = tonumber(ARGV[3])
local want_type, want_group = ARGV[4], ARGV[5]
local queue_count = tonumber(ARGV[6])
local queues = nil
if queue_count > 0 then
  queues = {}
  for n = 1, queue_count do
    queues[ARGV[6 + n]] = true
  end
end
local excluded = {}
local excluded_count = tonumber(ARGV[7 + queue_count])
for n = 1, excluded_count do
  excluded[ARGV[7 + queue_count + n]] = true
end
local first_status = 8 + queue_count + excluded_count
local scan = 4 * limit + 1000

local FIELDS = { 'status', 'finished_at', 'queue', 'type', 'group', 'business_key', 'replay_of', 'depends_on' }

-- The fields of a task that may go under this call's filter, or nil.
local function candidate(id, status)
  local f = redis.call('HMGET', task_key(id), unpack(FIELDS))
  local t = { id = id, status = f[1], finished_at = f[2], queue = f[3], type = f[4], group = f[5],
    business_key = f[6], replay_of = f[7], depends_on = f[8] }
  if t.status ~= status or not t.finished_at or tonumber(t.finished_at) > cutoff then
    return nil
  end
  if (queues and not queues[t.queue]) or excluded[t.queue] or (want_type ~= '' and t.type ~= want_type)
      or (want_group ~= '' and t.group ~= want_group) then
    return nil
  end
  return t
end

-- Whether `t` is free to go: no replay of it is stored, and all its children are final.
local function may_go(t)
  if redis.call('HEXISTS', B .. 'replays', t.id) == 1 then
    return false
  end
  for _, child in ipairs(redis.call('SMEMBERS', B .. 'children:' .. t.id)) do
    if not FINAL[redis.call('HGET', task_key(child), 'status')] then
      return false
    end
  end
  return true
end

local function remove(t, created_score_key)
  redis.call('DEL', task_key(t.id), B .. 'steps:' .. t.id, B .. 'children:' .. t.id)  -- its children are final
  for _, parent in ipairs(cjson.decode(t.depends_on)) do
    redis.call('SREM', B .. 'children:' .. parent, t.id)
  end
  for _, key in ipairs({ 'idx:all', 'idx:type:' .. t.type, 'idx:queue:' .. t.queue, created_score_key }) do
    redis.call('ZREM', B .. key, t.id)
  end
  if t.group then
    redis.call('ZREM', B .. 'idx:group:' .. t.group, t.id)
  end
  if t.business_key then
    redis.call('LREM', B .. 'bkey:' .. t.business_key, 0, t.id)
  end
  if t.replay_of and redis.call('HGET', B .. 'replays', t.replay_of) == t.id then
    redis.call('HDEL', B .. 'replays', t.replay_of)
  end
  count_status(t.status .. ':' .. t.type, -1)
end

local deleted = 0
for n = first_status, #ARGV do
  local status = ARGV[n]
  local index = 'idx:status:' .. status
  local ids = redis.call('ZRANGE', B .. index, '-inf', int_str(cutoff), 'BYSCORE', 'LIMIT', 0, scan)
  for _, id in ipairs(ids) do
    if deleted >= limit then
      break
    end
    local t = candidate(id, status)
    if t and may_go(t) then
      remove(t, index)
      deleted = deleted + 1
    end
  end
end
return { 'ok', deleted }
