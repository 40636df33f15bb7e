-- ack.lua: complete a running task and, in the same script, wake its children now ready.
--
-- KEYS[1]  base (hash-tagged prefix)
-- ARGV[1]  now in µs, or "" for the server's TIME
-- ARGV[2]  task id
-- ARGV[3]  lease token
-- ARGV[4]  has_result (0/1)
-- ARGV[5]  result bytes (ignored when has_result is 0)
-- Returns  {"ok", snapshot}; or {"notfound", id}; or {"leaselost", id, status}
--
-- Touches: task:<id> and task:<child> HASH, leases ZSET, children:<id> SET, stats HASH,
--          idx:status:<s> ZSET, queue:<q> ZSET and signal:<q> channel (PUBLISH) for woken children.

return ack_held(ARGV[2], ARGV[3], ARGV[4] == '1' and ARGV[5] or nil, false)
