-- heartbeat.lua: extend a running task's lease and report a pending cancel request.
--
-- KEYS[1]  base (hash-tagged prefix)
-- ARGV[1]  now in µs, or "" for the server's TIME
-- ARGV[2]  task id
-- ARGV[3]  lease token
-- ARGV[4]  lease ttl in µs
-- Returns  {"ok", lease_until (µs), cancel_requested (0/1)}; or {"notfound", id};
--          {"leaselost", id, status} when the token is not the current lease
--
-- Touches: task:<id> HASH, leases ZSET.

local id, token = ARGV[2], ARGV[3]
local t, err = load_leased(id, token)
if not t then
  return err
end
local lease_until = int_str(NOW + tonumber(ARGV[4]))
redis.call('HSET', task_key(id), 'lease_until', lease_until)
redis.call('ZADD', B .. 'leases', lease_until, id)
return { 'ok', lease_until, t.cancel_requested }
