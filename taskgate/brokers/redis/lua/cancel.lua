-- cancel.lua: cancel a task. blocked/pending/retrying: `canceled` now, with its descendants.
-- running: only marked (cancel_requested=1); the holder sees it on its next heartbeat.
--
-- KEYS[1]  base (hash-tagged prefix)
-- ARGV[1]  now in µs, or "" for the server's TIME
-- ARGV[2]  task id
-- Returns  {"ok", snapshot}; or {"notfound", id}; or {"final", id, status}
--
-- Touches: task:<id> and descendants' task:<id> HASH, queue:<q> ZSET, children:<id> SET,
--          stats HASH, idx:status:<s> ZSET, signal:<q> channel (PUBLISH).

local id = ARGV[2]
local t = load(id)
if not t then
  return { 'notfound', id }
end
if FINAL[t.status] then
  return { 'final', id, t.status }
end
if t.status == 'running' then
  redis.call('HSET', task_key(id), 'cancel_requested', '1')
else
  finish(t, 'canceled', CANCELED_ERROR)
end
return { 'ok', snapshot(id) }
