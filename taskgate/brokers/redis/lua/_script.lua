-- _script.lua: NOT a script on its own. The loader (scripts.py) puts a script's body in place
-- of the marker line below and registers `main` as one function of the library (`register`).
local function main()
--[[BODY]]
end
