--[[
test_schema.lua - tests of lua/schema.lua (a configuration section's unknown keys are refused,
naming the nearest known key), run inside the policy sandbox.
]]

local schema = require "schema"
local testlib = require "testlib"

local raises_exactly = testlib.raises_exactly

local POOL = { "name", "model", "sharing", "node_selector", "taints" }
local KNOWN = "(known: model, name, node_selector, sharing, taints)"

local function keys(t)
    return function()
        schema.keys(t, "pools[2].", POOL)
    end
end

return {
    ["a known key passes, and so does an absent section"] = function()
        schema.keys({ name = "a", node_selector = {} }, "pools[1].", POOL)
        schema.keys(nil, "placement.", POOL)
    end,
    ["another spelling of a key is named"] = function()
        raises_exactly(keys({ nodeSelector = {} }),
            "pools[2].nodeSelector: unknown key; did you mean node_selector? " .. KNOWN, "nodeSelector")
        raises_exactly(keys({ ["node-selector"] = {} }),
            "pools[2].node-selector: unknown key; did you mean node_selector? " .. KNOWN, "node-selector")
    end,
    ["a typo is named, a key far from every known one is not"] = function()
        raises_exactly(keys({ modle = "L4" }), "pools[2].modle: unknown key; did you mean model? " .. KNOWN,
            "modle")
        raises_exactly(keys({ gpus = 4 }), "pools[2].gpus: unknown key " .. KNOWN, "gpus")
    end,
    ["of several unknown keys, the first by name is named"] = function()
        raises_exactly(keys({ zeta = 1, alpha = 2, name = "x" }), "pools[2].alpha: unknown key " .. KNOWN,
            "two unknown")
    end,
}
