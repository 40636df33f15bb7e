-- heartbeat.lua: extend a running task's lease and report a pending cancel request; with a
-- slot queue, also extend the shared slot the lease holds there under its token (it expires
-- with the lease), or report it lost when it expired already (another holder may have its
-- capacity by now: the expired slot is dropped, not taken back).
--
-- KEYS[1]  base (hash-tagged prefix)
-- ARGV[1]  now in µs, or "" for the server's TIME
-- ARGV[2]  task id
-- ARGV[3]  lease token
-- ARGV[4]  lease ttl in µs
-- ARGV[5]  the queue of the lease's slot, "" for none
-- ARGV[6]  (optional) the progress JSON text to store on the task
-- Returns  {"ok", lease_until (µs), cancel_requested (0/1), slot_lost (0/1)}; or
--          {"notfound", id}; {"leaselost", id, status} when the token is not the current lease
--          (then the slot is left as it is)
--
-- Touches: task:<id> HASH (lease_until, progress), leases ZSET, slots:<queue> ZSET token -> expiry (µs).

local id, token = ARGV[2], ARGV[3]
local t, err = load_leased(id, token)
if not t then
  return err
end
local lease_until = int_str(NOW + tonumber(ARGV[4]))
if ARGV[6] then
  redis.call('HSET', task_key(id), 'lease_until', lease_until, 'progress', ARGV[6])
else
  redis.call('HSET', task_key(id), 'lease_until', lease_until)
end
redis.call('ZADD', B .. 'leases', lease_until, id)
local slot_lost = 0
if ARGV[5] ~= '' then
  local slots = B .. 'slots:' .. ARGV[5]
  local held_until = redis.call('ZSCORE', slots, token)
  if held_until and tonumber(held_until) > NOW then
    redis.call('ZADD', slots, 'XX', lease_until, token)
  else
    redis.call('ZREM', slots, token)
    slot_lost = 1
  end
end
return { 'ok', lease_until, t.cancel_requested, slot_lost }
