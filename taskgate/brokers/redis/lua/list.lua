-- list.lua: tasks matching a filter, sorted by (created_at, id) -- a business key's
-- executions oldest first -- then offset, then limit. Read-only; one script so the page is a
-- consistent snapshot.
--
-- Cost: with no filter or one of type/queue/status, O(log N + page) (ZRANGE on one index);
-- with several, O(candidates) (ZINTER of the index ZSETs, sorted by score then member, which
-- is exactly (created_at, id)); with a business key, O(executions of that key). Running
-- tasks have no status index: `leases` holds them (score: lease end), intersected with weight
-- 0 so the score stays created_at -- O(running tasks).
--
-- KEYS[1]  base (hash-tagged prefix)
-- ARGV[1]  now ("" or µs; unused)
-- ARGV[2]  offset
-- ARGV[3]  limit (0 = all)
-- ARGV[4..] filter pairs: "type" <t>, "queue" <q>, "status" <s>, "business_key" <k>,
--          "group" <g>, "parent" <id> (the tasks depending on <id>: O(its children))
-- Returns  {"ok", snapshot...}
--
-- Touches (read only): idx:all / idx:type:<t> / idx:queue:<q> / idx:status:<s> /
--          idx:group:<g> / leases
--          ZSET, bkey:<key> LIST, children:<id> SET, task:<id> HASH.

local offset, limit = tonumber(ARGV[2]), tonumber(ARGV[3])
-- The sets to intersect and their weights: 1 for a set scored by created_at, 0 for `leases`.
local want, indexes, weights = {}, {}, {}
for i = 4, #ARGV, 2 do
  local name, value = ARGV[i], ARGV[i + 1]
  want[name] = value
  if name == 'status' and value == 'running' then
    indexes[#indexes + 1], weights[#weights + 1] = B .. 'leases', 0
  elseif name ~= 'business_key' and name ~= 'parent' then
    indexes[#indexes + 1], weights[#weights + 1] = B .. 'idx:' .. name .. ':' .. value, 1
  end
end

local function page(ids)
  local reply = { 'ok' }
  local last = (limit == 0) and #ids or math.min(#ids, offset + limit)
  for i = offset + 1, last do
    reply[#reply + 1] = snapshot(ids[i])
  end
  return reply
end

-- The page of one index, read by `command` (ZRANGE of a ZSET, LRANGE of a LIST): only the
-- page's ids are read.
local function by_one_index(command, key)
  local stop = (limit == 0) and -1 or (offset + limit - 1)
  local ids = redis.call(command, key, offset, stop)
  offset = 0
  limit = 0
  return page(ids)
end

-- A business key's executions in the order of its LIST: the order they were created in, the
-- replay chain's, which times cannot tell apart when they tie (a coarse or frozen clock).
-- Alone, the key reads only the page of its LIST; with other filters, the
-- filtered fields of each execution pick the ones to page.
local function by_business_key()
  local key = B .. 'bkey:' .. want.business_key
  if #indexes == 0 then
    return by_one_index('LRANGE', key)
  end
  local ids = {}
  for _, id in ipairs(redis.call('LRANGE', key, 0, -1)) do
    local f = redis.call('HMGET', task_key(id), 'type', 'queue', 'status', 'group')
    if (not want.type or f[1] == want.type) and (not want.queue or f[2] == want.queue)
        and (not want.status or f[3] == want.status) and (not want.group or f[4] == want.group) then
      ids[#ids + 1] = id
    end
  end
  return page(ids)
end

local function by_intersection()
  local args = { 'ZINTER', #indexes }
  for _, key in ipairs(indexes) do
    args[#args + 1] = key
  end
  args[#args + 1] = 'WEIGHTS'
  for _, weight in ipairs(weights) do
    args[#args + 1] = weight
  end
  return page(redis.call(unpack(args)))
end

-- A task's children, from its `children:` SET: each one's fields pick those to page, in
-- (created_at, id) order (a set keeps none).
local function by_parent()
  local found = {}
  for _, id in ipairs(redis.call('SMEMBERS', B .. 'children:' .. want.parent)) do
    local f = redis.call('HMGET', task_key(id), 'type', 'queue', 'status', 'group', 'business_key',
      'created_at')
    if f[6] and (not want.type or f[1] == want.type) and (not want.queue or f[2] == want.queue)
        and (not want.status or f[3] == want.status) and (not want.group or f[4] == want.group)
        and (not want.business_key or f[5] == want.business_key) then
      found[#found + 1] = { tonumber(f[6]), id }
    end
  end
  table.sort(found, function(a, b) return a[1] < b[1] or (a[1] == b[1] and a[2] < b[2]) end)
  local ids = {}
  for n, entry in ipairs(found) do
    ids[n] = entry[2]
  end
  return page(ids)
end

if want.parent then
  return by_parent()
elseif want.business_key then
  return by_business_key()
elseif #indexes == 0 then
  return by_one_index('ZRANGE', B .. 'idx:all')
elseif #indexes == 1 and weights[1] == 1 then
  return by_one_index('ZRANGE', indexes[1])
elseif #indexes == 1 then  -- running tasks alone: `idx:all` gives their order
  indexes[2], weights[2] = B .. 'idx:all', 1
end
return by_intersection()
