-- finish_canceled.lua: end a running task whose handler was stopped by a cancel:
-- `canceled`, and its descendants canceled in the same script.
--
-- KEYS[1]  base (hash-tagged prefix)
-- ARGV[1]  now in µs, or "" for the server's TIME
-- ARGV[2]  task id
-- ARGV[3]  lease token
-- Returns  {"ok", snapshot}; or {"notfound", id}; or {"leaselost", id, status}
--
-- Touches: task:<id> and descendants' task:<id> HASH, leases ZSET, children:<id> SET,
--          stats HASH, idx:status:<s> ZSET, queue:<q> ZSET and signal:<q> channel (PUBLISH).

local id, token = ARGV[2], ARGV[3]
local t, err = load_leased(id, token)
if not t then
  return err
end
finish(t, 'canceled', CANCELED_ERROR)
return { 'ok', snapshot(id) }
