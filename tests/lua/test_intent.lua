--[[
test_intent.lua - tests of lua/intent.lua, run inside the policy sandbox.
]]

local intent = require "intent"
local testlib = require "testlib"

local eq = testlib.eq

local T = {}

local MIG = "mig.nvidia.com"
local PROFILE = "device.attributes['gpu.nvidia.com'].profile"

-- The milli-GPU of one device of a mig.nvidia.com request with these CEL selectors (no pool:
-- the largest share among the built-in models that have the profile).
local function unit(...)
    local selectors = {}
    for i, expr in ipairs({ ... }) do
        selectors[i] = { cel = { expression = expr } }
    end
    return intent.class_unit({}, MIG, { deviceClassName = MIG, selectors = selectors })
end

T["class_unit: a MIG request is charged the profile its selector pins"] = function()
    local small, big = unit(PROFILE .. " == '1g.5gb'"), unit(PROFILE .. " == '7g.40gb'")
    eq(small < 1000, true, "1g.5gb is a slice")
    eq(big, 1000, "7g.40gb is the whole GPU")
    eq(unit(), 1000, "no selector: any MIG device, a whole GPU at most")
    -- the same pin, written otherwise, or beside other terms every device must also satisfy
    for _, expr in ipairs({
        'device.attributes["gpu.nvidia.com"].profile=="1g.5gb"',
        "  " .. PROFILE .. " == '1g.5gb'  ",
        PROFILE .. " == '1g.5gb' && device.attributes['gpu.nvidia.com'].productName == 'NVIDIA A100-SXM4-40GB'",
        "device.attributes['gpu.nvidia.com'].productName == 'A || B' && " .. PROFILE .. " == '1g.5gb'",
        "(device.capacity['gpu.nvidia.com'].memory.compareTo(quantity('4Gi')) >= 0) && "
            .. PROFILE .. " == '1g.5gb'",
        -- '//' inside a literal is no comment
        "device.attributes['gpu.nvidia.com'].productName != 'a//b' && " .. PROFILE .. " == '1g.5gb'",
    }) do
        eq(unit(expr), small, expr)
    end
    eq(unit("device.driver == 'gpu.nvidia.com'", PROFILE .. " == '1g.5gb'"), small,
       "a second selector pins it: every selector must hold")
end

T["class_unit: a profile the expression does not pin charges a whole GPU"] = function()
    for _, expr in ipairs({
        -- every MIG device but a 1g.5gb (the 7g.40gb too), named first
        "!(" .. PROFILE .. " == '1g.5gb') && device.attributes['gpu.nvidia.com'].uuid != ''",
        PROFILE .. " == '1g.5gb' || true",
        "true || " .. PROFILE .. " == '1g.5gb'",
        "(" .. PROFILE .. " == '1g.5gb' && false) || true",
        "(" .. PROFILE .. " == '1g.5gb')",
        "true ? " .. PROFILE .. " == '1g.5gb' : true",
        PROFILE .. " != '1g.5gb'",
        PROFILE .. " == '1g.5gb' == false",
        "device.attributes['other.example.com'].profile == '1g.5gb'",
        "device.attributes['gpu.nvidia.com'].profile2 == '1g.5gb'",
        -- literals this reading could get wrong are refused, never read past
        "r'\\' == '\\' || true && " .. PROFILE .. " == '1g.5gb'",
        "'''a' || true && ''' == '' && " .. PROFILE .. " == '1g.5gb'",
        "'unterminated && " .. PROFILE .. " == '1g.5gb'",
        "f(a && " .. PROFILE .. " == '1g.5gb' && b)",
        "a) && (" .. PROFILE .. " == '1g.5gb'",
        -- CEL ignores a comment: the pin after '//' is no part of the expression, and a quote in
        -- a comment hides nothing
        'device.driver == "gpu.nvidia.com" // && ' .. PROFILE .. ' == "1g.5gb"',
        "device.driver == 'gpu.nvidia.com' // && " .. PROFILE .. " == '1g.5gb'",
        PROFILE .. " == '1g.5gb' // it's pinned\n|| true && x == 'it's'",
        PROFILE .. " == '1g.5gb' //\n|| true",
    }) do
        eq(unit(expr), 1000, expr)
    end
end

-- A ResourceClaim as the inventory keeps it, with these requests (class = count) and annotations.
local function claim(annotations, requests)
    local list = {}
    for _, r in ipairs(requests) do
        list[#list + 1] = { name = "r" .. #list, exactly = { deviceClassName = r[1], count = r[2] } }
    end
    return { kind = "ResourceClaim", metadata = { name = "c", namespace = "team-a", annotations = annotations },
             spec = { devices = { requests = list } } }
end

T["usage_charge: the scheduler's claim counts the devices its pod was not charged for"] = function()
    local cfg = { dra = { classes = { ["gpu.example.com"] = 1 } } }
    local scheduler = { ["resource.kubernetes.io/extended-resource-claim"] = "true" }
    local generated = { ["resource.kubernetes.io/pod-claim-name"] = "gpus" }
    eq(intent.usage_charge(claim(nil, { { "gpu.example.com", 2 } }), cfg), 2000, "a claim of its own")
    eq(intent.usage_charge(claim(generated, { { "gpu.example.com", 2 } }), cfg), 0,
       "made from its pod's template: the pod is charged")
    -- The pod was charged for deviceclass.resource.kubernetes.io/gpu.nvidia.com, not for a
    -- class only the configuration knows as a GPU: the claim holds those.
    eq(intent.usage_charge(claim(scheduler, { { "gpu.nvidia.com", 4 } }), cfg), 0, "NVIDIA's class")
    eq(intent.usage_charge(claim(scheduler, { { "gpu.example.com", 3 } }), cfg), 3000, "another class")
    eq(intent.usage_charge(claim(scheduler, { { "gpu.nvidia.com", 4 }, { "gpu.example.com", 3 },
                                              { "rdma.example.com", 8 } }), cfg), 3000, "both, and a NIC")
end

return T
