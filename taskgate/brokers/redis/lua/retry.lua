-- retry.lua: count a failed run by kind and make the task `retrying`, due after a delay.
-- If a cancel was requested meanwhile, the task is canceled (with cascade) instead.
--
-- KEYS[1]  base (hash-tagged prefix)
-- ARGV[1]  now in µs, or "" for the server's TIME
-- ARGV[2]  task id
-- ARGV[3]  lease token
-- ARGV[4]  failure kind: "business", "throttled" or "skip"
-- ARGV[5]  error text (stored as last_error)
-- ARGV[6]  delay in µs
-- Returns  {"ok", snapshot}; or {"notfound", id}; or {"leaselost", id, status}
--
-- Touches: task:<id> and descendants' task:<id> HASH, leases ZSET, queue:<q> ZSET,
--          signal:<q> channel (PUBLISH), children:<id> SET, stats HASH, idx:status:<s> ZSET.

local id, token = ARGV[2], ARGV[3]
local t, err = load_leased(id, token)
if not t then
  return err
end
count_failure(t, ARGV[4])
redis.call('HSET', task_key(id), 'last_error', ARGV[5])
if t.cancel_requested == '1' then
  finish(t, 'canceled', {})
else
  make_ready(t, 'retrying', int_str(NOW + tonumber(ARGV[6])))
end
return { 'ok', snapshot(id) }
