-- claim.lua: lease up to `limit` due tasks of one queue, oldest due first (run_at, then id).
-- Taking a task off the queue and giving it a lease happen in this one script, so there is
-- no moment at which a task has left the queue without a lease.
--
-- KEYS[1]  base (hash-tagged prefix)
-- ARGV[1]  now in µs, or "" for the server's TIME
-- ARGV[2]  queue
-- ARGV[3]  lease ttl in µs
-- ARGV[4..] one fresh lease token per task that may be claimed (their count is the limit)
-- Returns  {"ok", snapshot...}: one snapshot per claimed task (token and lease_until
--          included), oldest due first; {"held", until} when the queue is held (`queue_hold`)
--
-- Touches: hold:<q> STRING (read), queue:<q> ZSET, leases ZSET, task:<id> HASH, stats HASH, idx:status:<s> ZSET.

local queue = ARGV[2]
local held = queue_hold(queue)
if held then
  return { 'held', held }
end
local ttl = tonumber(ARGV[3])
local limit = #ARGV - 3
local lease_until = int_str(NOW + ttl)
local ids = redis.call('ZRANGEBYSCORE', B .. 'queue:' .. queue, '-inf', NOW_S, 'LIMIT', 0, limit)
local reply = { 'ok' }
for i, id in ipairs(ids) do
  reply[#reply + 1] = lease_task(id, ARGV[3 + i], lease_until)
end
return reply
