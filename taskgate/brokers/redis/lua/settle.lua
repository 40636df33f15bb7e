-- settle.lua: end the runs of several running tasks, each item as it would end alone, and
-- give back quota units and shared slots -- one script, so one unit and one round trip for
-- any mix (a settle of acks alone runs ack_many.lua, whose items are a fixed four values).
-- Items run in order and are answered on their own: a stale token or unknown id answers its
-- item with an error and writes nothing for it; the others still take effect. The capacity
-- goes back first: no item touches it, so no caller can tell, and a give-back that raises
-- (a key of the wrong type) then raises before any item was written.
--
-- KEYS[1]  base (hash-tagged prefix)
-- ARGV[1]  now in µs, or "" for the server's TIME
-- ARGV[2]  "snapshots", or "quiet": answer an item that took effect without its snapshot
-- ARGV[3]  number Q of quota give-backs; then Q groups of: quota key, window start (µs, from
--          the grant), units to give back
-- then     the queue of the slots to give back ("" for none), the number R of slot tokens,
--          and those R tokens
-- then     the number N of items, and the N items in order, each its kind and its values:
--            "complete" id token has_result(0/1) result   (result ignored when has_result is 0)
--            "retry"    id token failure_kind error delay_us hold_queue(0/1) has_tb(0/1) traceback
--            "fail"     id token failure_kind error has_tb(0/1) traceback comp_id comp_type
--                       comp_queue comp_max_retry   (comp_id "": no compensation to submit)
--          (traceback: the task's new last_traceback, ignored when has_tb is 0: the field is
--          then deleted)
--            "requeue"  id token
--            "canceled" id token
--          (failure_kind: "business", "throttled" or "skip")
-- Returns  {"ok", answer...}: one answer per item, each {"ok", snapshot} ({"ok"} when quiet)
--          or {"notfound", id} or {"leaselost", id, status}
--
-- Touches: quota:<key> HASH {start, used}, slots:<queue> ZSET, hold:<queue> STRING, task:<id> and descendants'
--          task:<id> HASH, leases ZSET, queue:<q> ZSET, signal:<q> channel (PUBLISH),
--          children:<id> SET, stats HASH, idx:status:<s> ZSET; for a compensation also
--          due:<n>:<q>:<type> ZSET, types:<q> SET, idx:all / idx:type:<t> / idx:queue:<q> ZSET.

local quiet = ARGV[2] == 'quiet'
local at = 3

-- The next `n` arguments.
local function take(n)
  at = at + n
  return unpack(ARGV, at - n, at - 1)
end

-- Units go back only to the window they came from (one no longer kept no longer matters),
-- never below 0.
for _ = 1, tonumber(take(1)) do
  local name, start, n = take(3)
  local key = B .. 'quota:' .. name
  if redis.call('HGET', key, 'start') == start then
    local used = tonumber(redis.call('HGET', key, 'used') or '0')
    redis.call('HSET', key, 'used', int_str(math.max(0, used - tonumber(n))))
  end
end

-- A slot is its holder's token: ZREM of a token no longer held does nothing (at most once).
local slot_queue, slot_count = take(2)
local tokens = {}
for _ = 1, tonumber(slot_count) do
  tokens[#tokens + 1] = take(1)
end
if #tokens > 0 then
  call_chunked('ZREM', B .. 'slots:' .. slot_queue, tokens)
end

local ENDS = {
  complete = function()
    local id, token, has_result, result = take(4)
    return ack_held(id, token, has_result == '1' and result or nil, quiet), nil
  end,
  retry = function()
    local id, token, kind, text, delay, hold, has_tb, tb = take(8)
    return retry_held(id, token, kind, text, delay, hold, has_tb == '1' and tb or nil), id
  end,
  fail = function()
    local id, token, kind, text, has_tb, tb, comp_id, comp_type, comp_queue, comp_retry = take(10)
    local comp = comp_id ~= '' and { comp_id, comp_type, comp_queue, comp_retry } or nil
    return fail_held(id, token, kind, text, has_tb == '1' and tb or nil, comp), id
  end,
  requeue = function()
    local id, token = take(2)
    return requeue_held(id, token), id
  end,
  canceled = function()
    local id, token = take(2)
    return cancel_held(id, token), id
  end,
}

local reply = { 'ok' }
for _ = 1, tonumber(take(1)) do
  local answer, ended = ENDS[take(1)]()
  if not answer then  -- ended: answered here (ack_held answers its own)
    answer = quiet and { 'ok' } or { 'ok', snapshot(ended) }
  end
  reply[#reply + 1] = answer
end
return reply
