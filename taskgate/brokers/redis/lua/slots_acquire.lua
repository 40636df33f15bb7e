-- slots_acquire.lua: take up to n of a queue's `capacity` concurrency slots.
-- Slots are members of a ZSET scored by their expiry; expired slots are purged here first,
-- so a crashed holder's slots come back once their ttl passes, and only unexpired slots
-- count against the capacity, which is global to every process sharing this Redis.
--
-- KEYS[1]  base (hash-tagged prefix)
-- ARGV[1]  now in µs, or "" for the server's TIME
-- ARGV[2]  queue
-- ARGV[3]  capacity
-- ARGV[4]  ttl in µs
-- ARGV[5..] one fresh token per slot wanted (their count is n)
-- Returns  {"ok", token...}: the tokens granted (possibly none)
--
-- Touches: slots:<queue> ZSET token -> expiry (µs).

local key = B .. 'slots:' .. ARGV[2]
local capacity = tonumber(ARGV[3])
local expiry = int_str(NOW + tonumber(ARGV[4]))
redis.call('ZREMRANGEBYSCORE', key, '-inf', NOW_S)
local free = capacity - redis.call('ZCARD', key)
local reply = { 'ok' }
for i = 5, #ARGV do
  if free <= 0 then
    break
  end
  redis.call('ZADD', key, expiry, ARGV[i])
  reply[#reply + 1] = ARGV[i]
  free = free - 1
end
return reply
