-- history.lua: every execution of a business key, oldest first (read-only snapshot).
--
-- KEYS[1]  base (hash-tagged prefix)
-- ARGV[1]  now ("" or µs; unused)
-- ARGV[2]  business key
-- Returns  {"ok", snapshot...}
--
-- Touches (read only): bkey:<key> LIST, task:<id> HASH.

local reply = { 'ok' }
for _, id in ipairs(redis.call('LRANGE', B .. 'bkey:' .. ARGV[2], 0, -1)) do
  reply[#reply + 1] = snapshot(id)
end
return reply
