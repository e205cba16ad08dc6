--[[
test_fleet.lua - tests of lua/fleet.lua, run inside the policy sandbox.
]]

local fleet = require "fleet"
local testlib = require "testlib"

local eq = testlib.eq

local T = {}

T["per_config: built once per configuration table, and again for another"] = function()
    local calls = 0
    local build = function(cfg)
        calls = calls + 1
        return { pools = #(cfg.pools or {}) }
    end
    local of = fleet.per_config(build)
    local a, b = { pools = { {}, {} } }, { pools = {} }
    local first = of(a)
    eq(first.pools, 2, "built from a")
    eq(rawequal(of(a), first), true, "the same table the second time")
    eq(calls, 1, "built once for a")
    eq(of(b).pools, 0, "built from b")
    eq(calls, 2, "once more for b")
    local other = fleet.per_config(build)
    other(a)
    eq(calls, 3, "each per_config keeps its own")
end

T["catalog: the configuration's catalog, the same table each time"] = function()
    local cfg = {}
    eq(rawequal(fleet.catalog(cfg), fleet.catalog(cfg)), true, "kept")
    eq(fleet.catalog(cfg).names[1] ~= nil, true, "the built-in models")
end

return T
