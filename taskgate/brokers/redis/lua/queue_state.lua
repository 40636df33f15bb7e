-- queue_state.lua: how many tasks of a queue are pending or retrying (due or not), for a
-- quota key its current window's figures -- as claim_quota.lua would find the window
-- (`quota_window`, _lib.lua): none taken yet is 0 used, a forgotten window (the clock stepped
-- back) has nothing left --, and when asked how many of those tasks are unhandled: due for
-- longer than a given time, of a type not among the given handled ones. Read-only.
--
-- KEYS[1]  base (hash-tagged prefix)
-- ARGV[1]  now in µs, or "" for the server's TIME
-- ARGV[2]  queue
-- ARGV[3]  quota key, or "" for no quota
-- ARGV[4]  quota limit (units per window; with a quota key)
-- ARGV[5]  quota period in µs (with a quota key)
-- ARGV[6]  (optional) count the unhandled tasks: those due for longer than this many µs ...
-- ARGV[7]  ... of a type not in this NUL-separated list ("": every type counts)
-- Returns  {"ok", queue length, hold, window start (µs) or "", units used (at most the limit)
--          or "" (both "" without a quota key), unhandled (only with ARGV[6])}; hold: the
--          queue's (`queue_hold`), "" when it is not held
--
-- Touches (read only): queue:<q> ZSET, hold:<q> STRING, quota:<key> HASH, types:<q> SET,
-- due:<n>:<q>:<type> ZSET, prios:<q> ZSET, pqueue:<p>:<q> ZSET, pdue:<p>:<n>:<q>:<type> ZSET.

local queue = ARGV[2]
local reply = { 'ok', ready_count(queue), queue_hold(queue) or '', '', '' }
if ARGV[3] ~= '' then
  local limit = tonumber(ARGV[4])
  local start, _, left = quota_window(B .. 'quota:' .. ARGV[3], limit, tonumber(ARGV[5]))
  reply[4], reply[5] = int_str(start), limit - left
end
if not ARGV[6] then
  return reply
end
local handled = {}
for name in string.gmatch(ARGV[7], '[^%z]+') do
  handled[name] = true
end
local cutoff = int_str(NOW - tonumber(ARGV[6]))
local unhandled = 0
local levels = priority_levels(queue)
for _, name in ipairs(redis.call('SMEMBERS', B .. 'types:' .. queue)) do
  if not handled[name] then
    for _, p in ipairs(levels) do
      unhandled = unhandled + redis.call('ZCOUNT', due_key(queue, name, p), '-inf', cutoff)
    end
  end
end
reply[6] = unhandled
return reply
