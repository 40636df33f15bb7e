-- ack_many.lua: complete many running tasks in one script; each item is answered on its own.
-- Items run in order, each exactly as it would alone: a stale token or unknown id answers its
-- item with an error and writes nothing for it; the others still complete. A cancel mark does
-- not stop an ack: the work is done, so the task completes.
--
-- KEYS[1]  base (hash-tagged prefix)
-- ARGV[1]  now in µs, or "" for the server's TIME
-- ARGV[2]  "snapshots", or "quiet": answer a completed item without its snapshot
-- ARGV[3]  number of items N; then N groups of 4 values, in item order:
--          task id, lease token, has_result (0/1), result bytes (ignored when has_result is 0)
-- Returns  {"ok", answer...}: one answer per item, each {"ok", snapshot} ({"ok"} when quiet)
--          or {"notfound", id} or {"leaselost", id, status}
--
-- Touches: task:<id> and task:<child> HASH, leases ZSET, children:<id> SET, stats HASH,
--          idx:status:<s> ZSET, queue:<q> ZSET and signal:<q> channel (PUBLISH) for woken children.

local ITEM = 4
local quiet = ARGV[2] == 'quiet'

local reply = { 'ok' }
for i = 0, tonumber(ARGV[3]) - 1 do
  local a = 4 + i * ITEM
  reply[#reply + 1] = ack_held(ARGV[a], ARGV[a + 1], ARGV[a + 2] == '1' and ARGV[a + 3] or nil, quiet)
end
return reply
