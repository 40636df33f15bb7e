-- reap.lua: take back running tasks whose lease ended (lease_until <= now).
-- Each gets lease_lost += 1 and goes back to `pending`, due now; at lease_lost_max it fails
-- (with cascade); one marked for cancel is canceled. The lease leaves the leases ZSET in the
-- same script, so two reapers never count one lease twice. An id whose task hash is gone (an
-- operator's DEL, an eviction) or no longer running only leaves the leases ZSET: nothing to
-- take back, and skipping it keeps one such id from stopping every later pass.
--
-- KEYS[1]  base (hash-tagged prefix)
-- ARGV[1]  now in µs, or "" for the server's TIME
-- ARGV[2]  lease_lost_max
-- ARGV[3]  limit: at most this many tasks
-- ARGV[4]  a fresh ULID: the first compensation's id (the next ones count up from it)
-- ARGV[5]  number C of compensations; then C groups of: failed task type, compensation type,
--          its queue, its max_retry -- a task failed at lease_lost_max whose type is one of
--          them gets that task submitted in this script
-- Returns  {"ok", snapshot...}: the new snapshot of each reaped task (none for an id dropped)
--
-- Touches: leases ZSET, task:<id> and descendants' task:<id> HASH, queue:<q> ZSET,
--          signal:<q> channel (PUBLISH), children:<id> SET, stats HASH, idx:status:<s> ZSET
--          (and idx:status:running of earlier builds, trimmed to the running tasks); for a
--          compensation also due:<n>:<q>:<type> ZSET, types:<q> SET, idx:all / idx:type:<t> /
--          idx:queue:<q> ZSET.

local lost_max = tonumber(ARGV[2])
local next_id = ARGV[4]
local compensations = {}
for i = 0, tonumber(ARGV[5]) - 1 do
  local a = 6 + i * 4
  compensations[ARGV[a]] = { ARGV[a + 1], ARGV[a + 2], ARGV[a + 3] }
end
local ids = redis.call('ZRANGEBYSCORE', B .. 'leases', '-inf', NOW_S, 'LIMIT', 0, tonumber(ARGV[3]))
local reply = { 'ok' }
for _, id in ipairs(ids) do
  local t = load(id)
  if not t or t.status ~= 'running' then
    -- Checked before any write: an HINCRBY would leave a stub hash of a deleted task, and
    -- the next line would raise at that id on every pass.
    redis.call('ZREM', B .. 'leases', id)
  else
    local lost = redis.call('HINCRBY', task_key(id), 'lease_lost', 1)
    if t.cancel_requested == '1' then
      finish(t, 'canceled', CANCELED_ERROR)
    elseif lost >= lost_max then
      local why = 'lease lost ' .. lost .. ' times (lease_lost_max=' .. ARGV[2] .. ')'
      finish(t, 'failed', { 'last_error', why })
      local comp = compensations[t.type]
      if comp then
        next_id = next_ulid(store_compensation(next_id, comp[1], comp[2], comp[3], id))
      end
    else
      make_ready(t, 'pending', NOW_S)
    end
    reply[#reply + 1] = snapshot(id)
  end
end
-- Earlier builds kept running tasks in a status set as well as in `leases`, and a process of
-- one may still add to it during a rolling redeploy: keep only what is still running, so the
-- set empties itself once no such process is left (at no cost to claims and acks).
local legacy = B .. 'idx:status:running'
if redis.call('EXISTS', legacy) == 1 then
  redis.call('ZINTERSTORE', legacy, 2, legacy, B .. 'leases', 'WEIGHTS', 1, 0)
end
return reply
