-- claim.lua: lease up to `limit` due tasks of one queue, oldest due first (run_at, then id).
-- Taking a task off the queue and giving it a lease happen in this one script, so there is
-- no moment at which a task has left the queue without a lease.
--
-- KEYS[1]  base (hash-tagged prefix)
-- ARGV[1]  now in µs, or "" for the server's TIME
-- ARGV[2]  queue
-- ARGV[3]  lease ttl in µs
-- ARGV[4]  the types to claim, NUL-separated ("" for any type; see `due_ids`)
-- ARGV[5..] one fresh lease token per task that may be claimed (their count is the limit)
-- Returns  {"ok", snapshot...}: one snapshot per claimed task (token and lease_until
--          included), oldest due first; {"held", until} when the queue is held (`queue_hold`)
--
-- Touches: hold:<q> STRING (read), queue:<q> ZSET, due:<n>:<q>:<type> ZSET, leases ZSET,
--          task:<id> HASH, stats HASH, idx:status:<s> ZSET.

local queue = ARGV[2]
local held = queue_hold(queue)
if held then
  return { 'held', held }
end
local ttl = tonumber(ARGV[3])
local limit = #ARGV - 4
local lease_until = int_str(NOW + ttl)
local ids = due_ids(queue, ARGV[4], limit)
local reply = { 'ok' }
for i, id in ipairs(ids) do
  reply[#reply + 1] = lease_task(id, ARGV[4 + i], lease_until)
end
return reply
