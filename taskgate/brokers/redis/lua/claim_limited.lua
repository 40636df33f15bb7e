-- claim_limited.lua: claim up to `limit` due tasks of one queue, each under one of the
-- queue's `capacity` global concurrency slots and, when asked, one start of the queue's GCRA
-- limiter (`gcra_take`) and one unit of a quota key's current window (`quota_window`) -- in
-- one step, so slots, starts and units are taken only for tasks claimed, and nothing is
-- given back afterwards. A slot's token IS its task's lease token and expires with the lease
-- (heartbeat.lua renews it with the lease; settle.lua and the next claim give it back).
-- With group limits (ARGV[12]), each group of the queue is limited on its own too: see
-- "Groups" below.
--
-- KEYS[1]  base (hash-tagged prefix)
-- ARGV[1]  now in µs, or "" for the server's TIME
-- ARGV[2]  queue
-- ARGV[3]  slot capacity of the queue
-- ARGV[4]  lease ttl in µs (also the slots' ttl)
-- ARGV[5]  rps, "0" for no rate (> 0 may be fractional)
-- ARGV[6]  burst (>= 1 when rps > 0)
-- ARGV[7]  quota key, "" for no quota
-- ARGV[8]  quota limit (units per window)
-- ARGV[9]  quota period in µs
-- ARGV[10] this claimer's id ("" : no turn-taking, see below)
-- ARGV[11] the types to claim, NUL-separated ("" for any type; see `due_ids`)
-- ARGV[12] the group limits, "" for none, else "workers rps burst quota period_us" (each 0
--          where unset; burst 0 means 1)
-- ARGV[13] number R of slot tokens to give back first (slots of tasks that finished)
-- ARGV[14..13+R] those tokens
-- ARGV[14+R..] one fresh lease token per task that may be claimed (their count is the limit)
--
-- Turn-taking: a claimer whose tasks finish gives their slots back in its next claim, so
-- without a rule it would take them straight back and other processes would never see a free
-- slot. A claimer that found no free slot while tasks were due is noted in slot_waiters:<q>
-- (until now + lease ttl; noted once, so it keeps its place in line); every other claimer
-- leaves one free slot per noted waiter, and a waiter one per waiter noted before it -- first
-- come, first served, so the claimer whose own handlers just finished (and who hears of the
-- free slots first) does not jump the line. A waiter that gets a slot is struck off. A
-- claimer that gave slots back (ARGV[13]) and left free ones to waiters while tasks are still
-- due publishes signal:<q>, so a waiter claims now instead of at its next look (only then: a
-- waiter that died must not make every claim publish).
--
-- Groups (only when ARGV[12] sets a limit: a claim without one runs none of this, and costs
-- what it did before groups). Each group of the queue (a task's `group` field) is limited on
-- its own; tasks without a group count against the queue's limits only.
-- - Slots: a group's slots are the queue's own slots whose token slot_groups:<q> maps to it.
--   Slots are given back (settle.lua, a claim's ARGV[13..]), renewed (heartbeat.lua) and
--   expire in slots:<q> alone, so a group's count follows at once and those scripts need not
--   know of groups -- simpler than a ZSET per group, which each of them would have to keep in
--   step. The price: a claim with group_workers counts the groups' slots by reading every
--   live slot of the queue (ZRANGE + HMGET, O(slots held), about the queue's workers), and
--   the map's entries of slots no longer held are pruned once they outnumber the held ones.
-- - Rate: a GCRA arrival time per group (group_rate:*), as the queue's; quota: a window per
--   group (group_quota:*, `quota_window`). A group's rate holding its tasks back sets no
--   retry_after: only the queue's rate does (other groups may still have room).
-- - The walk (`due_with_room`): the due candidates in claim order, passing over those of a
--   group without room (a group's room is read once, the first time one of its tasks is
--   met); slots, starts and units are spent only for the tasks leased. Redis keeps no due
--   order per group, so a group at its limit with many due tasks ahead is walked past one
--   candidate (an HGET) at a time: in chunks -- first max(limit + 1, 64), then twice as many
--   each time, so a claim whose first candidates have room reads no more than one chunk --
--   and never past GROUP_WALK_CAP (2000) candidates in all, which keeps one claim's server
--   time to a few milliseconds (about 1 µs a candidate; a claim of some types re-reads or
--   checks its due sets, about twice that). So a claim finds another group's task behind up to
--   2000 due tasks of groups without room; one further back waits until tasks ahead of it
--   start or leave. An index of due tasks per group would lift the cap, but every submit,
--   retry and lease of every queue, grouped or not, would pay one more ZSET write for it:
--   too much for a case only a backlog over 2000 deep of groups at their limit meets.
--
-- Returns  {"ok", retry_after_seconds (string), quota window start (µs), quota units left
--          before the claim (-1 without a quota), snapshot...}: one snapshot per
--          claimed task, oldest due first; retry_after > 0 when the rate held tasks back;
--          {"held", until} when the queue is held (`queue_hold`): the slots named are given
--          back, nothing else taken
--
-- Touches: hold:<q> STRING (read), slots:<q> ZSET, slot_waiters:<q> ZSET, rate:<q> STRING,
--          quota:<key> HASH, queue:<q> ZSET, due:<n>:<q>:<type> ZSET, leases ZSET, task:<id> HASH,
--          stats HASH, idx:status:<s> ZSET, signal:<q> channel (PUBLISH); with group limits
--          also slot_groups:<q> HASH (token -> group), group_rate:<n>:<q>:<group> STRING,
--          group_quota:<n>:<q>:<group> HASH {start, used}.

local queue = ARGV[2]
local slots = B .. 'slots:' .. queue
local claimer = ARGV[10]
local types = ARGV[11]
local released = tonumber(ARGV[13])
local first_token = 14 + released
local wanted = #ARGV - first_token + 1
if released > 0 then
  local tokens = {}
  for i = 14, 13 + released do
    tokens[#tokens + 1] = ARGV[i]
  end
  call_chunked('ZREM', slots, tokens)
end
local held = queue_hold(queue)
if held then
  return { 'held', held }
end
redis.call('ZREMRANGEBYSCORE', slots, '-inf', NOW_S)
local unused = tonumber(ARGV[3]) - redis.call('ZCARD', slots)
local free = unused
local waiters = B .. 'slot_waiters:' .. queue
local waiting = false
local owed = 0
if claimer ~= '' then
  redis.call('ZREMRANGEBYSCORE', waiters, '-inf', NOW_S)
  local noted = redis.call('ZSCORE', waiters, claimer)
  waiting = noted ~= false
  if waiting then
    owed = redis.call('ZCOUNT', waiters, '-inf', '(' .. noted)  -- noted before this claimer
  else
    owed = redis.call('ZCARD', waiters)
  end
  if owed > 0 then
    free = free - owed
  end
end
local limit = math.min(wanted, free)

local function any_due()
  return #due_ids(queue, types, 1) > 0
end

-- Slots given back here and left to waiters: wake them (see "Turn-taking" above).
local function wake_waiters(claimed, more_due)
  if released > 0 and owed > 0 and unused - claimed > 0 and more_due() then
    signal(queue)
  end
end

-- Note or strike off this claimer as a waiter (see "Turn-taking" above).
local function take_turn(claimed)
  if claimer == '' then
    return
  end
  if claimed > 0 then
    if waiting then
      redis.call('ZREM', waiters, claimer)
    end
  elseif free <= 0 and not waiting and any_due() then
    redis.call('ZADD', waiters, int_str(NOW + tonumber(ARGV[4])), claimer)
  end
end

local quota_key, window_start, used, left = nil, 0, 0, -1
if ARGV[7] ~= '' then
  quota_key = B .. 'quota:' .. ARGV[7]
  window_start, used, left = quota_window(quota_key, tonumber(ARGV[8]), tonumber(ARGV[9]))
  limit = math.min(limit, left)
end

local reply = { 'ok', '0', int_str(window_start), left }
if limit <= 0 then
  take_turn(0)
  wake_waiters(0, any_due)
  return reply
end
-- One id more than the limit: whether tasks are left due for the waiters.
local grouped, ids, groups, states = group_limits(ARGV[12]), nil, nil, nil
if grouped then
  states = {}
  prune_slot_groups(queue)
  ids, groups = due_with_room(grouped, queue, types, limit + 1,
    grouped.workers > 0 and group_slots_held(queue) or {}, states)
else
  ids = due_ids(queue, types, limit + 1)
end
local n = math.min(#ids, limit)
if n > 0 and tonumber(ARGV[5]) > 0 then
  local retry_after
  n, retry_after = gcra_take(B .. 'rate:' .. queue, tonumber(ARGV[5]), tonumber(ARGV[6]), n)
  reply[2] = string.format('%.6f', retry_after)
end
local lease_until = int_str(NOW + tonumber(ARGV[4]))
for i = 1, n do
  local token = ARGV[first_token - 1 + i]
  zset_later(slots, token, lease_until)
  reply[#reply + 1] = lease_task(ids[i], token, lease_until)
end
if grouped and n > 0 then
  spend_groups(grouped, queue, states, groups, ARGV, first_token, n)
end
if quota_key and n > 0 then
  redis.call('HSET', quota_key, 'start', int_str(window_start), 'used', int_str(used + n))
end
take_turn(n)
wake_waiters(n, function() return n < #ids end)  -- beyond the limit, or held back by the rate
return reply
