-- claim_slots.lua: claim up to `limit` due tasks of one queue, each under one of the queue's
-- `capacity` global concurrency slots, in one step: a slot is taken only for a task claimed,
-- and the slot's token IS the task's lease token, expiring with the lease.
-- (slots_acquire.lua then claim.lua would be two round trips, and slots taken for an empty
-- queue would be released again.)
--
-- KEYS[1]  base (hash-tagged prefix)
-- ARGV[1]  now in µs, or "" for the server's TIME
-- ARGV[2]  queue
-- ARGV[3]  slot capacity of the queue
-- ARGV[4]  lease ttl in µs (also the slots' ttl)
-- ARGV[5..] one fresh lease token per task that may be claimed (their count is the limit)
-- Returns  {"ok", snapshot...}: one HGETALL array per claimed task, oldest due first
--
-- Touches: slots:<q> ZSET, queue:<q> ZSET, leases ZSET, task:<id> HASH, stats HASH,
-- idx:status:<s> ZSET.

local queue = ARGV[2]
local slots = B .. 'slots:' .. queue
local lease_until = int_str(NOW + tonumber(ARGV[4]))
redis.call('ZREMRANGEBYSCORE', slots, '-inf', NOW_S)
local limit = math.min(#ARGV - 4, tonumber(ARGV[3]) - redis.call('ZCARD', slots))
local reply = { 'ok' }
if limit <= 0 then
  return reply
end
local ids = redis.call('ZRANGEBYSCORE', B .. 'queue:' .. queue, '-inf', NOW_S, 'LIMIT', 0, limit)
for i, id in ipairs(ids) do
  local token = ARGV[4 + i]
  redis.call('ZADD', slots, lease_until, token)
  reply[#reply + 1] = lease_task(id, token, lease_until)
end
return reply
