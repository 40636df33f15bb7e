-- quota_release.lua: give n units back to the window they came from, never below 0.
-- A window that is no longer the kept one is left alone (its units no longer matter).
--
-- KEYS[1]  base (hash-tagged prefix)
-- ARGV[1]  now ("" or µs; unused)
-- ARGV[2]  quota key
-- ARGV[3]  window start in µs (from the grant)
-- ARGV[4]  n (units to give back)
-- Returns  {"ok"}
--
-- Touches: quota:<key> HASH {start, used}.

local key = B .. 'quota:' .. ARGV[2]
if redis.call('HGET', key, 'start') == ARGV[3] then
  local used = tonumber(redis.call('HGET', key, 'used') or '0')
  redis.call('HSET', key, 'used', int_str(math.max(0, used - tonumber(ARGV[4]))))
end
return { 'ok' }
