-- quota_reserve.lua: take up to n units of the current window of a quota key.
-- Windows are aligned to the Unix epoch on the broker's clock (server TIME unless a clock
-- was injected). Only the newest window of a key is kept: a clock that steps back into a
-- forgotten window gets 0 units (issue fewer, never more).
--
-- KEYS[1]  base (hash-tagged prefix)
-- ARGV[1]  now in µs, or "" for the server's TIME
-- ARGV[2]  quota key
-- ARGV[3]  limit (units per window)
-- ARGV[4]  period in µs
-- ARGV[5]  n (units wanted)
-- Returns  {"ok", window_start (µs), granted}
--
-- Touches: quota:<key> HASH {start = window start µs, used = units taken in that window}.

local key = B .. 'quota:' .. ARGV[2]
local limit, period, n = tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5])
local start, used, left, forgotten = quota_window(key, limit, period)
if forgotten then
  return { 'ok', int_str(start), 0 }
end
local granted = math.min(n, left)
redis.call('HSET', key, 'start', int_str(start), 'used', int_str(used + granted))
return { 'ok', int_str(start), granted }
