-- fail.lua: count a failed run by kind, make the task `failed` and cancel its descendants.
--
-- KEYS[1]  base (hash-tagged prefix)
-- ARGV[1]  now in µs, or "" for the server's TIME
-- ARGV[2]  task id
-- ARGV[3]  lease token
-- ARGV[4]  failure kind: "business", "throttled" or "skip"
-- ARGV[5]  error text (stored as last_error)
-- Returns  {"ok", snapshot}; or {"notfound", id}; or {"leaselost", id, status}
--
-- Touches: task:<id> and descendants' task:<id> HASH, leases ZSET, children:<id> SET,
--          stats HASH, idx:status:<s> ZSET, queue:<q> ZSET and signal:<q> channel (PUBLISH)
--          for children that ignore parent failure and become ready.

local id, token = ARGV[2], ARGV[3]
local t, err = load_leased(id, token)
if not t then
  return err
end
count_failure(t, ARGV[4])
finish(t, 'failed', { 'last_error', ARGV[5] })
return { 'ok', snapshot(id) }
