-- claim_slots_rate.lua: claim_slots.lua with the queue's global start rate in the same step:
-- up to `limit` due tasks, each under one of the queue's `capacity` slots and one start of
-- its GCRA limiter (rate_take.lua). Slots and starts are taken only for tasks claimed, so a
-- claim that finds fewer tasks than free slots spends no start it does not use.
--
-- KEYS[1]  base (hash-tagged prefix)
-- ARGV[1]  now in µs, or "" for the server's TIME
-- ARGV[2]  queue
-- ARGV[3]  slot capacity of the queue
-- ARGV[4]  lease ttl in µs (also the slots' ttl)
-- ARGV[5]  rps (> 0, may be fractional)
-- ARGV[6]  burst (>= 1)
-- ARGV[7..] one fresh lease token per task that may be claimed (their count is the limit)
-- Returns  {"ok", retry_after_seconds (string), snapshot...}: one HGETALL array per claimed
--          task, oldest due first; retry_after > 0 when the rate held tasks back
--
-- Touches: slots:<q> ZSET, rate:<q> STRING, queue:<q> ZSET, leases ZSET, task:<id> HASH,
-- stats HASH, idx:status:<s> ZSET.

local queue = ARGV[2]
local slots = B .. 'slots:' .. queue
local lease_until = int_str(NOW + tonumber(ARGV[4]))
redis.call('ZREMRANGEBYSCORE', slots, '-inf', NOW_S)
local limit = math.min(#ARGV - 6, tonumber(ARGV[3]) - redis.call('ZCARD', slots))
if limit <= 0 then
  return { 'ok', '0' }
end
local ids = redis.call('ZRANGEBYSCORE', B .. 'queue:' .. queue, '-inf', NOW_S, 'LIMIT', 0, limit)
if #ids == 0 then
  return { 'ok', '0' }
end
local granted, retry_after = gcra_take(B .. 'rate:' .. queue, tonumber(ARGV[5]), tonumber(ARGV[6]), #ids)
local reply = { 'ok', string.format('%.6f', retry_after) }
for i = 1, granted do
  local token = ARGV[6 + i]
  redis.call('ZADD', slots, lease_until, token)
  reply[#reply + 1] = lease_task(ids[i], token, lease_until)
end
return reply
