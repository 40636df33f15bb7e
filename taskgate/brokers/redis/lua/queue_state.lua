-- queue_state.lua: how many tasks of a queue are pending or retrying (due or not) and, for a
-- quota key, its current window's figures -- as claim_quota.lua would find the window
-- (`quota_window`, _lib.lua): none taken yet is 0 used, a forgotten window (the clock stepped
-- back) has nothing left. Read-only.
--
-- KEYS[1]  base (hash-tagged prefix)
-- ARGV[1]  now in µs, or "" for the server's TIME
-- ARGV[2]  queue
-- ARGV[3]  quota key, or "" for no quota
-- ARGV[4]  quota limit (units per window; with a quota key)
-- ARGV[5]  quota period in µs (with a quota key)
-- Returns  {"ok", queue length, hold} without a quota key;
--          {"ok", queue length, hold, window start (µs), units used (at most the limit)} with
--          one; hold: the queue's (`queue_hold`), "" when it is not held
--
-- Touches (read only): queue:<q> ZSET, hold:<q> STRING, quota:<key> HASH.

local queue_len = redis.call('ZCARD', B .. 'queue:' .. ARGV[2])
local held = queue_hold(ARGV[2]) or ''
if ARGV[3] == '' then
  return { 'ok', queue_len, held }
end
local limit = tonumber(ARGV[4])
local start, _, left = quota_window(B .. 'quota:' .. ARGV[3], limit, tonumber(ARGV[5]))
return { 'ok', queue_len, held, int_str(start), limit - left }
