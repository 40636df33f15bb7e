-- _chain.lua: NOT a script on its own. The loader (scripts.py, `chained`) puts the bodies of
-- two scripts in place of the two marker lines below and registers `main` as one more function
-- of the library: it runs the first and then, only when it answered "ok", the second -- one
-- round trip where the two scripts take two (a worker's quiet acks and its queue's next claim).
--
-- ARGV[1]      "now" for both parts
-- ARGV[2]      the number N of the first part's own arguments: ARGV[3..2+N]
-- ARGV[3+N..]  the second part's own arguments
-- Each part sees its arguments as ARGV[2..], as when it runs alone.
-- Returns  {first_reply} when the first part failed its checks (nothing written), else
--          {first_reply, second_reply}; a second part that raised answers {"failed", message}:
--          the first part's writes stand, so the reply must say so rather than raise.
--
-- The first part's deferred writes are flushed before the second runs: the second reads
-- what the first deferred (a claim reads the queue the acks woke children into). A second
-- part that raised has its deferred writes dropped, as when a script alone raises.
--
-- The first part's wake-ups (`signal`) are held back until the second has run, and sent only
-- for queues that still hold a pending task then: when the claim took the child the acks
-- woke, waking every waiter of its queue would only make them look and find nothing.

local function first_part(ARGV)
--[[FIRST]]
end

local function second_part(ARGV)
--[[SECOND]]
end

local function main()
  local split = tonumber(ARGV[2])
  local first_args, second_args = { ARGV[1] }, { ARGV[1] }
  for i = 3, 2 + split do
    first_args[#first_args + 1] = ARGV[i]
  end
  for i = 3 + split, #ARGV do
    second_args[#second_args + 1] = ARGV[i]
  end
  local first = first_part(first_args)
  if first[1] ~= 'ok' then
    return { first }
  end
  flush_status()
  local held = SIGNALED
  SIGNALED = {}
  local ran, second = pcall(second_part, second_args)
  if not ran then
    ZSET_CHANGES, STATUS_COUNTS, SIGNALED = {}, {}, held
    return { first, { 'failed', type(second) == 'table' and second.err or tostring(second) } }
  end
  flush_status()
  for queue in pairs(held) do
    if ready_count(queue) > 0 then
      SIGNALED[queue] = true
    end
  end
  return { first, second }
end
