-- fill_finished.lua: add completed no-op tasks F<lo>..F<hi> to a taskgate Redis store (benchmark set-up).
--
-- KEYS[1]  base of the broker's keys (hash-tagged prefix, e.g. "tg:{tg}:")
-- ARGV[1]  first number, ARGV[2] last number (ids are "F" .. 12-digit zero-padded number)
-- ARGV[3]  created/run/started/finished time in µs since the epoch
-- ARGV[4]  type and queue of the tasks
-- Returns  how many tasks were written.
--
-- Touches: task:<id> HASH (write), stats HASH ("completed:<type>" += n),
--          idx:all / idx:type:<t> / idx:queue:<q> / idx:status:completed ZSET (score = created_at);
--          the same fields and indexes taskgate's enqueue.lua and ack.lua leave behind.

local base, lo, hi, at, kind = KEYS[1], tonumber(ARGV[1]), tonumber(ARGV[2]), ARGV[3], ARGV[4]
local indexes = { base .. 'idx:all', base .. 'idx:type:' .. kind, base .. 'idx:queue:' .. kind,
  base .. 'idx:status:completed' }
for i = lo, hi do
  local id = string.format('F%012d', i)
  redis.call('HSET', base .. 'task:' .. id, 'id', id, 'type', kind, 'queue', kind, 'status', 'completed',
    'created_at', at, 'run_at', at, 'started_at', at, 'finished_at', at, 'attempts', '0',
    'max_retry', '0', 'throttled', '0', 'lease_lost', '0', 'claims', '1', 'depends_on', '[]',
    'ignore_parent_failure', '0', 'cancel_requested', '0')
  for _, index in ipairs(indexes) do
    redis.call('ZADD', index, at, id)
  end
end
redis.call('HINCRBY', base .. 'stats', 'completed:' .. kind, hi - lo + 1)
return hi - lo + 1
