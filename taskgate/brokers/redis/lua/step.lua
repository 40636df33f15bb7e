-- step.lua: read a task's durable step (`Broker.step`), or store its result unless one of that
-- name is stored already (the first writer wins); answer what is stored after the call. No
-- lease token: a run that lost its lease keeps what it paid for.
--
-- KEYS[1]  base (hash-tagged prefix)
-- ARGV[1]  now in µs, or "" for the server's TIME (unused)
-- ARGV[2]  task id
-- ARGV[3]  step name
-- ARGV[4]  (optional) the result to store, JSON bytes; absent: only read
-- Returns  {"ok", result} (result false when none is stored); or {"notfound", id}
--
-- Touches: task:<id> HASH (EXISTS), steps:<id> HASH step name -> result (HSETNX, HGET).

local id, name = ARGV[2], ARGV[3]
if redis.call('EXISTS', task_key(id)) == 0 then
  return { 'notfound', id }
end
local steps = B .. 'steps:' .. id
if ARGV[4] then
  redis.call('HSETNX', steps, name, ARGV[4])
end
return { 'ok', redis.call('HGET', steps, name) }
