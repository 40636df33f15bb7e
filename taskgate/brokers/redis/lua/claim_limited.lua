-- claim_limited.lua: claim up to `limit` due tasks of one queue, each under one of the
-- queue's `capacity` global concurrency slots and, when asked, one start of the queue's GCRA
-- limiter (`gcra_take`) and one unit of a quota key's current window (`quota_window`) -- in
-- one step, so slots, starts and units are taken only for tasks claimed, and nothing is
-- given back afterwards. A slot's token IS its task's lease token and expires with the lease
-- (heartbeat.lua renews it with the lease; settle.lua and the next claim give it back).
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
-- ARGV[12] number R of slot tokens to give back first (slots of tasks that finished)
-- ARGV[13..12+R] those tokens
-- ARGV[13+R..] one fresh lease token per task that may be claimed (their count is the limit)
--
-- Turn-taking: a claimer whose tasks finish gives their slots back in its next claim, so
-- without a rule it would take them straight back and other processes would never see a free
-- slot. A claimer that found no free slot while tasks were due is noted in slot_waiters:<q>
-- (until now + lease ttl; noted once, so it keeps its place in line); every other claimer
-- leaves one free slot per noted waiter, and a waiter one per waiter noted before it -- first
-- come, first served, so the claimer whose own handlers just finished (and who hears of the
-- free slots first) does not jump the line. A waiter that gets a slot is struck off. A claimer that gave slots back (ARGV[11]) and left free ones
-- to waiters while tasks are still due publishes signal:<q>, so a waiter claims now instead of
-- at its next look (only then: a waiter that died must not make every claim publish).
-- Returns  {"ok", retry_after_seconds (string), quota window start (µs), quota units left
--          before the claim (-1 without a quota), snapshot...}: one snapshot per
--          claimed task, oldest due first; retry_after > 0 when the rate held tasks back;
--          {"held", until} when the queue is held (`queue_hold`): the slots named are given
--          back, nothing else taken
--
-- Touches: hold:<q> STRING (read), slots:<q> ZSET, slot_waiters:<q> ZSET, rate:<q> STRING,
--          quota:<key> HASH, queue:<q> ZSET, due:<n>:<q>:<type> ZSET, leases ZSET, task:<id> HASH,
--          stats HASH, idx:status:<s> ZSET, signal:<q> channel (PUBLISH).

local queue = ARGV[2]
local slots = B .. 'slots:' .. queue
local claimer = ARGV[10]
local types = ARGV[11]
local released = tonumber(ARGV[12])
local first_token = 13 + released
local wanted = #ARGV - first_token + 1
if released > 0 then
  local tokens = {}
  for i = 13, 12 + released do
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
local ids = due_ids(queue, types, limit + 1)
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
if quota_key and n > 0 then
  redis.call('HSET', quota_key, 'start', int_str(window_start), 'used', int_str(used + n))
end
take_turn(n)
wake_waiters(n, function() return n < #ids end)  -- beyond the limit, or held back by the rate
return reply
