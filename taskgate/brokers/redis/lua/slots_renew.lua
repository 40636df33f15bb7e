-- slots_renew.lua: extend held slots to now + ttl; a slot already expired is dropped and
-- reported lost (another holder may have its capacity by now).
--
-- KEYS[1]  base (hash-tagged prefix)
-- ARGV[1]  now in µs, or "" for the server's TIME
-- ARGV[2]  queue
-- ARGV[3]  ttl in µs
-- ARGV[4..] tokens
-- Returns  {"ok", lost_token...}
--
-- Touches: slots:<queue> ZSET token -> expiry (µs).

local key = B .. 'slots:' .. ARGV[2]
local expiry = int_str(NOW + tonumber(ARGV[3]))
local reply = { 'ok' }
for i = 4, #ARGV do
  local score = redis.call('ZSCORE', key, ARGV[i])
  if score and tonumber(score) > NOW then
    redis.call('ZADD', key, 'XX', expiry, ARGV[i])
  else
    redis.call('ZREM', key, ARGV[i])
    reply[#reply + 1] = ARGV[i]
  end
end
return reply
