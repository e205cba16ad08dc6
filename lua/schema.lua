--[[
schema.lua - a configuration section's keys are known or refused.

A key nothing reads is a setting that silently does nothing (`max_per_pods:` for `max_per_pod:`
would drop the limit), so each section's checker refuses the keys it does not know, naming the
path and the nearest known key:

    pools[2].nodeSelector: unknown key; did you mean node_selector? (known: cost, ...)

The top-level sections are checked by the engine (webhook/engine/cfgkeys.c: the one table of the
sections gpuguard reads; a policy of one's own names its sections in its table's config field).
]]

local gg = require "gpuguard"

local M = {}

--- Raise error(msg, 0) for the first (by name) key of table t that is not in the list known;
--- path is the section's path with its trailing dot ("pools[2].").  Anything but a table (nil:
--- the section is absent) passes: its checker says what it must be.
function M.keys(t, path, known)
    if type(t) ~= "table" then
        return
    end
    local set = {}
    for _, name in ipairs(known) do
        set[name] = true
    end
    local first
    for k in pairs(t) do
        local name = tostring(k)
        if not set[k] and (first == nil or name < first) then
            first = name
        end
    end
    if first then
        error(gg.unknown_key(path, first, known), 0)
    end
end

return M
