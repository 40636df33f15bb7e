-- next_due.lua: the broker's "now" and when the earliest ready task of some queues is due,
-- so wait_for_work can also wake when a delayed task falls due. Read-only.
--
-- KEYS[1]  base (hash-tagged prefix)
-- ARGV[1]  now in µs, or "" for the server's TIME
-- ARGV[2..] queues
-- Returns  {"ok", now (µs), earliest run_at (µs) or ""}
--
-- Touches (read only): queue:<q> ZSET, prios:<q> ZSET, pqueue:<p>:<q> ZSET.

local earliest = nil
for i = 2, #ARGV do
  for _, p in ipairs(priority_levels(ARGV[i])) do
    local head = redis.call('ZRANGE', ready_key(ARGV[i], p), 0, 0, 'WITHSCORES')
    if head[2] then
      local run_at = tonumber(head[2])
      if not earliest or run_at < earliest then
        earliest = run_at
      end
    end
  end
end
return { 'ok', NOW_S, earliest and int_str(earliest) or '' }
