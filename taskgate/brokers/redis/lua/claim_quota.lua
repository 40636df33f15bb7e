-- claim_quota.lua: claim up to `limit` due tasks of one queue, one unit of a quota key's
-- current window per task, in one step: units are taken only for tasks claimed, so none are
-- given back afterwards. Windows are `quota_window`'s (_lib.lua): epoch-aligned, only the
-- newest kept, a clock stepping back into a forgotten window gets nothing.
--
-- KEYS[1]  base (hash-tagged prefix)
-- ARGV[1]  now in µs, or "" for the server's TIME
-- ARGV[2]  queue
-- ARGV[3]  lease ttl in µs
-- ARGV[4]  quota key
-- ARGV[5]  quota limit (units per window)
-- ARGV[6]  quota period in µs
-- ARGV[7]  the types to claim, NUL-separated ("" for any type; see `due_ids`)
-- ARGV[8..] one fresh lease token per task that may be claimed (their count is the limit)
-- Returns  {"ok", window_start (µs), units left before the claim, snapshot...}: one snapshot
--          per claimed task, oldest due first; {"held", until} when the queue is held
--          (`queue_hold`), having taken no unit
--
-- Touches: hold:<q> STRING (read), quota:<key> HASH, queue:<q> ZSET, due:<n>:<q>:<type> ZSET,
--          leases ZSET, task:<id> HASH, stats HASH, idx:status:<s> ZSET.

local queue = ARGV[2]
local held = queue_hold(queue)
if held then
  return { 'held', held }
end
local key = B .. 'quota:' .. ARGV[4]
local start, used, left = quota_window(key, tonumber(ARGV[5]), tonumber(ARGV[6]))
local limit = math.min(#ARGV - 7, left)
local reply = { 'ok', int_str(start), left }
if limit <= 0 then
  return reply
end
local ids = due_ids(queue, ARGV[7], limit)
local lease_until = int_str(NOW + tonumber(ARGV[3]))
for i, id in ipairs(ids) do
  reply[#reply + 1] = lease_task(id, ARGV[7 + i], lease_until)
end
if #ids > 0 then
  redis.call('HSET', key, 'start', int_str(start), 'used', int_str(used + #ids))
end
return reply
