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

local granted, retry_after = gcra_take(B .. 'rate:' .. ARGV[2], tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5]))
return { 'ok', granted, string.format('%.6f', retry_after) }
