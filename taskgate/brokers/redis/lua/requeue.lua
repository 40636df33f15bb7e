-- requeue.lua: put a running task back to `pending`, due now, touching no counter
-- (graceful shutdown). If a cancel was requested meanwhile, cancel it (with cascade) instead.
--
-- KEYS[1]  base (hash-tagged prefix)
-- ARGV[1]  now in µs, or "" for the server's TIME
-- ARGV[2]  task id
-- ARGV[3]  lease token
-- Returns  {"ok", snapshot}; or {"notfound", id}; or {"leaselost", id, status}
--
-- Touches: task:<id> and descendants' task:<id> HASH, leases ZSET, queue:<q> ZSET,
--          signal:<q> channel (PUBLISH), children:<id> SET, stats HASH, idx:status:<s> ZSET.

local id, token = ARGV[2], ARGV[3]
local t, err = load_leased(id, token)
if not t then
  return err
end
if t.cancel_requested == '1' then
  finish(t, 'canceled', CANCELED_ERROR)
else
  make_ready(t, 'pending', NOW_S)
end
return { 'ok', snapshot(id) }
