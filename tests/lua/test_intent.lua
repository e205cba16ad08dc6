--[[
test_intent.lua - tests of lua/intent.lua, run inside the policy sandbox.
]]

local gg = require "gpuguard"
local intent = require "intent"
local testlib = require "testlib"

local eq = testlib.eq
local raises = testlib.raises

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

-- The memo of intent.charge: a pod as the API server creates it, and copies of it with one
-- part changed (change(p) edits the copy).
local function gpu_pod(change)
    local p = {
        apiVersion = "v1", kind = "Pod",
        metadata = { name = "train-1", namespace = "team-a", uid = "u-1", labels = { app = "train" },
                     annotations = { ["gpuguard.io/charge"] = "500", note = "x" } },
        spec = {
            nodeSelector = { pool = "a100" },
            containers = { { name = "main", image = "cuda:12", env = { { name = "E", value = "1" } },
                             resources = { limits = { ["nvidia.com/gpu"] = "1", cpu = "2" } } } },
        },
    }
    if change then
        change(p)
    end
    return p
end

local MEMO_CFG = gg.readonly({ pools = { { name = "a100", model = "A100-SXM4-80GB", sharing = "exclusive",
                                           node_selector = { pool = "a100" } } } })

T["charge: a copy that differs in what the charge does not read is answered from the memo"] = function()
    local total, breakdown = intent.charge(gpu_pod(), MEMO_CFG, { namespace = "team-a" })
    eq(total, 1000, "one whole GPU")
    for what, change in pairs({
        ["its name and uid"] = function(p) p.metadata.name, p.metadata.uid = "train-2", "u-2" end,
        ["a label"] = function(p) p.metadata.labels.app = "other" end,
        ["another annotation"] = function(p) p.metadata.annotations.note = "y" end,
        ["the environment"] = function(p) p.spec.containers[1].env[1].value = "2" end,
        ["the image"] = function(p) p.spec.containers[1].image = "cuda:13" end,
        ["cpu"] = function(p) p.spec.containers[1].resources.limits.cpu = "4" end,
    }) do
        local t2, b2 = intent.charge(gpu_pod(change), MEMO_CFG, { namespace = "team-a" })
        eq(t2, total, what)
        eq(rawequal(b2, breakdown), true, what .. ": the breakdown remembered")
    end
end

T["charge: each part the charge reads is worked out apart"] = function()
    local _, breakdown = intent.charge(gpu_pod(), MEMO_CFG, { namespace = "team-a" })
    for what, change in pairs({
        ["the namespace"] = function(p) p.metadata.namespace = "team-b" end,
        ["the charge annotation"] = function(p) p.metadata.annotations["gpuguard.io/charge"] = "250" end,
        ["KAI's gpu-fraction"] = function(p) p.metadata.annotations["gpu-fraction"] = "0.5" end,
        ["the node selector"] = function(p) p.spec.nodeSelector.pool = "l4" end,
        ["a GPU request"] = function(p) p.spec.containers[1].resources.limits["nvidia.com/gpu"] = "2" end,
        ["a GPU request's section"] = function(p)
            local r = p.spec.containers[1].resources
            r.requests, r.limits = r.limits, nil
        end,
        ["the container's name"] = function(p) p.spec.containers[1].name = "other" end,
        ["a restart policy"] = function(p) p.spec.containers[1].restartPolicy = "Always" end,
        ["an init container"] = function(p)
            p.spec.initContainers = { { name = "init", resources = { limits = { ["nvidia.com/gpu"] = "1" } } } }
        end,
        ["a second container"] = function(p)
            p.spec.containers[2] = { name = "side", resources = { limits = { ["nvidia.com/gpu"] = "1" } } }
        end,
        ["a claim"] = function(p) p.spec.resourceClaims = { { name = "g", resourceClaimName = "shared" } } end,
        ["a claim's status"] = function(p)
            p.status = { resourceClaimStatuses = { { name = "g", resourceClaimName = "made" } } }
        end,
    }) do
        local _, b2 = intent.charge(gpu_pod(change), MEMO_CFG, { namespace = "team-a" })
        eq(rawequal(b2, breakdown), false, what)
    end
    local _, b3 = intent.charge(gpu_pod(), MEMO_CFG, { namespace = "team-b" })
    eq(rawequal(b3, breakdown), false, "the request's namespace")
end

T["charge: a decision's own charge is never remembered, and what the memo keeps is read-only"] = function()
    local pool = MEMO_CFG.pools[1]
    local _, b1 = intent.charge(gpu_pod(), MEMO_CFG, { pool = pool, namespace = "team-a" })
    local _, b2 = intent.charge(gpu_pod(), MEMO_CFG, { pool = pool, namespace = "team-a" })
    eq(rawequal(b1, b2), false, "worked out on a pool the policy chose")
    local _, kept = intent.charge(gpu_pod(), MEMO_CFG, { namespace = "team-a" })
    raises(function() kept[1].charge = 0 end, "read-only", "an entry of the breakdown")
    raises(function() kept[#kept + 1] = {} end, "read-only", "the breakdown")
end

T["charge: the memo is bounded in entries and in bytes"] = function()
    local function charge_with(note)
        local _, b = intent.charge(gpu_pod(function(p) p.metadata.annotations["gpuguard.io/charge"] = note end),
            MEMO_CFG, { namespace = "team-a" })
        return b
    end
    local first = charge_with("first")
    eq(rawequal(charge_with("first"), first), true, "remembered")
    for i = 1, 1024 do
        charge_with(tostring(i))
    end
    eq(rawequal(charge_with("first"), first), false, "forgotten once 1024 more were remembered")
    first = charge_with("first")
    local long = string.rep("x", 800 * 1024)
    charge_with(long .. "1")
    charge_with(long .. "2")
    eq(rawequal(charge_with("first"), first), true, "two long keys fit")
    charge_with(long .. "3")
    eq(rawequal(charge_with("first"), first), false, "forgotten once the keys passed 2 MiB")
end

T["charge: only a v1 Pod's charge is remembered (a workload's is its template's)"] = function()
    local function workload(replicas_image)
        return { apiVersion = "apps/v1", kind = "Deployment", metadata = { namespace = "team-a" },
                 spec = { template = { spec = { containers = { { name = "main", image = replicas_image,
                     resources = { limits = { ["nvidia.com/gpu"] = "1" } } } } } } } }
    end
    local t1, b1 = intent.charge(workload("a"), MEMO_CFG, { namespace = "team-a" })
    local t2, b2 = intent.charge(workload("a"), MEMO_CFG, { namespace = "team-a" })
    eq(t1, 1000, "the template's GPU")
    eq(t2, t1, "the same charge")
    eq(rawequal(b1, b2), false, "worked out each time")
end

return T
