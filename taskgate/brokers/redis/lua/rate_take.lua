-- rate_take.lua: take up to n starts from a queue's GCRA limiter (rate `rps`, `burst`).
-- GCRA keeps one number, the theoretical arrival time (TAT): each start pushes it one
-- emission interval T = 1/rps further; a start is allowed while TAT - now <= burst * T,
-- i.e. at most `burst` starts at once and `rps` per second after that.
--
-- KEYS[1]  base (hash-tagged prefix)
-- ARGV[1]  now in µs, or "" for the server's TIME
-- ARGV[2]  queue
-- ARGV[3]  rps (> 0, may be fractional)
-- ARGV[4]  burst (>= 1)
-- ARGV[5]  n (starts wanted)
-- Returns  {"ok", granted, retry_after_seconds (string)}
--
-- Touches: rate:<queue> STRING (TAT in µs; expires once it lies in the past).

local key = B .. 'rate:' .. ARGV[2]
local interval = 1000000 / tonumber(ARGV[3])
local burst, n = tonumber(ARGV[4]), tonumber(ARGV[5])
local tat = math.max(tonumber(redis.call('GET', key) or '0'), NOW)
local room = math.floor((NOW + burst * interval - tat) / interval + 1e-9)
local granted = math.max(0, math.min(n, room))
tat = tat + granted * interval
local retry_after = 0
if granted < n then
  -- the next start is allowed once TAT - later <= (burst - 1) * T
  retry_after = math.max(0, tat - (burst - 1) * interval - NOW) / 1000000
end
if granted > 0 then
  redis.call('SET', key, string.format('%.3f', tat), 'PX', math.ceil((tat - NOW) / 1000) + 60000)
end
return { 'ok', granted, string.format('%.6f', retry_after) }
