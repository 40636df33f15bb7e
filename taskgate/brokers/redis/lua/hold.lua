-- hold.lua: hold a queue -- no claim leases its tasks until the hold ends -- keeping a longer
-- hold, or end its hold (a resume, which wakes its waiters).
--
-- KEYS[1]  base (hash-tagged prefix)
-- ARGV[1]  now in µs, or "" for the server's TIME
-- ARGV[2]  queue
-- ARGV[3]  "resume"; or how long to hold it, in µs; or "-1": until resumed
-- Returns  {"ok", hold}: the queue's hold after the call (`queue_hold`), "" when not held
--
-- Touches: hold:<q> STRING, signal:<q> channel (PUBLISH, on a resume).

local queue = ARGV[2]
if ARGV[3] == 'resume' then
  redis.call('DEL', B .. 'hold:' .. queue)
  signal(queue)
  return { 'ok', '' }
end
extend_hold(queue, ARGV[3] == '-1' and '-1' or int_str(NOW + tonumber(ARGV[3])))
return { 'ok', queue_hold(queue) or '' }
