--[[
test_choice.lua - tests of lua/choice.lua (the node labels gpuguard knows of each pool, the pool a
pod chooses, whether a pool's nodes can run a pod), fleet.candidates and rightsize.placed, run
inside the policy sandbox.
]]

local choice = require "choice"
local fleet = require "fleet"
local rightsize = require "rightsize"
local testlib = require "testlib"

local eq = testlib.eq

local GIB = 1024 * 1024 * 1024 * 1000 -- milli-bytes

local function fleet_cfg()
    return {
        pools = {
            { name = "h100", model = "H100-80GB", sharing = "exclusive", cost = 4,
                node_selector = { ["gpuguard.io/pool"] = "h100" },
                taints = { { key = "nvidia.com/gpu", value = "h100", effect = "NoSchedule" } } },
            { name = "a100-mig", model = "A100-80GB", sharing = "mig", cost = 2,
                node_selector = { ["gpuguard.io/pool"] = "a100-mig" } },
            { name = "l4", model = "L4", sharing = "exclusive", node_selector = { ["gpuguard.io/pool"] = "l4" } },
            { name = "l4-ts", model = "L4", sharing = "time-slicing", replicas = 4,
                node_selector = { ["gpuguard.io/pool"] = "l4-ts" } },
        },
        classes = {
            inference = { sharing = { "mig", "time-slicing", "exclusive" }, pools = { "a100-mig", "l4", "l4-ts" } },
            batch = { sharing = { "time-slicing", "exclusive" } },
        },
        default_class = "batch",
    }
end

local function pool(cfg, name)
    return fleet.pool(cfg, name)
end

-- Does a pod with this spec (and annotations) choose pool?
local function allows(cfg, spec, name, annotations)
    local pod = { metadata = { annotations = annotations }, spec = spec }
    local ch = choice.of(pod, spec, cfg)
    assert(ch, "the pod makes a choice")
    return (choice.allows(ch, cfg, pool(cfg, name)))
end

local function affinity(...)
    return { nodeAffinity = { requiredDuringSchedulingIgnoredDuringExecution = {
        nodeSelectorTerms = { { matchExpressions = { ... } } } } } }
end

local T = {}

T["of: only keys gpuguard knows are a choice"] = function()
    local cfg = fleet_cfg()
    local spec = { nodeSelector = { ["topology.kubernetes.io/zone"] = "a" },
        affinity = affinity({ key = "kubernetes.io/hostname", operator = "In", values = { "n1" } }) }
    eq(choice.of({ spec = spec }, spec, cfg), nil, "a zone and a hostname")
    local own = { metadata = { annotations = { ["gpuguard.io/pool"] = "l4", ["gpuguard.io/decision"] = "x" } },
        spec = {} }
    eq(choice.of(own, own.spec, cfg), nil, "gpuguard's own annotations")
end

T["memory: NVML's figure is a little under the catalog's; Gt, Lt and In on it"] = function()
    local cfg = fleet_cfg()
    local function mem(op, v)
        return affinity({ key = "nvidia.com/gpu.memory", operator = op, values = { v } })
    end
    eq(allows(cfg, { affinity = mem("In", "81559") }, "h100"), true, "81559 MiB is an 80 GB GPU")
    eq(allows(cfg, { affinity = mem("In", "81559") }, "l4"), false, "not an L4")
    eq(allows(cfg, { affinity = mem("In", "23034") }, "l4"), true, "23034 MiB is an L4")
    eq(allows(cfg, { affinity = mem("Gt", "40000") }, "a100-mig"), true, "Gt 40000: the A100")
    eq(allows(cfg, { affinity = mem("Gt", "40000") }, "l4-ts"), false, "Gt 40000: not the L4")
    eq(allows(cfg, { affinity = mem("Lt", "30000") }, "l4"), true, "Lt 30000: the L4")
    eq(allows(cfg, { affinity = mem("Gt", "many") }, "l4"), false, "no node has a label above a word")
end

T["operators on value labels: In, NotIn, Exists, DoesNotExist; terms are ORed"] = function()
    local cfg = fleet_cfg()
    local function expr(op, ...)
        return { key = "nvidia.com/gpu.family", operator = op, values = { ... } }
    end
    eq(allows(cfg, { affinity = affinity(expr("In", "hopper", "ampere")) }, "h100"), true, "In")
    eq(allows(cfg, { affinity = affinity(expr("NotIn", "hopper")) }, "h100"), false, "NotIn")
    eq(allows(cfg, { affinity = affinity(expr("Exists")) }, "l4"), true, "Exists")
    eq(allows(cfg, { affinity = affinity(expr("DoesNotExist")) }, "l4"), false, "DoesNotExist")
    local two = { nodeAffinity = { requiredDuringSchedulingIgnoredDuringExecution = { nodeSelectorTerms = {
        { matchExpressions = { expr("In", "hopper") } }, { matchExpressions = { expr("In", "ada-lovelace") } } } } } }
    eq(allows(cfg, { affinity = two }, "l4"), true, "the second term")
    eq(allows(cfg, { affinity = two }, "a100-mig"), false, "neither term")
end

T["products: a time-sliced pool that keeps nvidia.com/gpu publishes -SHARED"] = function()
    local cfg = fleet_cfg()
    local function product(v)
        return { nodeSelector = { ["nvidia.com/gpu.product"] = v } }
    end
    eq(allows(cfg, product("NVIDIA-L4"), "l4"), true, "exclusive L4")
    eq(allows(cfg, product("NVIDIA-L4"), "l4-ts"), false, "not the shared L4")
    eq(allows(cfg, product("NVIDIA-L4-SHARED"), "l4-ts"), true, "the shared L4")
    eq(allows(cfg, product("NVIDIA-A100-80GB-PCIe"), "a100-mig"), true, "any product of the model")
end

T["gpu-model: a name, an alias, or an ambiguous name meaning any of its models"] = function()
    local cfg = fleet_cfg()
    eq(allows(cfg, {}, "a100-mig", { ["gpuguard.io/gpu-model"] = "A100" }), true, "A100")
    eq(allows(cfg, {}, "h100", { ["gpuguard.io/gpu-model"] = "A100" }), false, "not the H100")
    eq(allows(cfg, {}, "l4", { ["gpuguard.io/gpu-model"] = "nvidia-l4" }), true, "a product, any case")
    local pod = { metadata = { annotations = { ["gpuguard.io/gpu-model"] = "Z9" } }, spec = {} }
    local ch, msg = choice.of(pod, pod.spec, cfg)
    eq(ch, false, "an unknown model")
    eq(msg:match("^annotation gpuguard.io/gpu%-model: Z9 is not a GPU model") ~= nil, true, msg)
end

T["runnable: a taint not tolerated, a selector the pool's nodes lack"] = function()
    local cfg = fleet_cfg()
    local h100 = pool(cfg, "h100")
    -- gpuguard placed it in h100 (and says so): that entry is no choice of the pod's
    local pod = { metadata = { annotations = { ["gpuguard.io/node-selector"] = "gpuguard.io/pool=h100" } },
        spec = { nodeSelector = { ["gpuguard.io/pool"] = "h100" } } }
    local ok, msg = choice.runnable(pod, pod.spec, cfg, h100)
    eq(ok, false, "no toleration")
    eq(msg, "no node of pool h100 can run the pod: it does not tolerate the taint nvidia.com/gpu=h100:NoSchedule",
        "the taint")
    pod.spec.tolerations = { { key = "nvidia.com/gpu", operator = "Exists" } }
    eq(choice.runnable(pod, pod.spec, cfg, h100), true, "tolerated")
    pod.spec.nodeSelector["nvidia.com/gpu.product"] = "NVIDIA-L4"
    ok, msg = choice.runnable(pod, pod.spec, cfg, h100)
    eq(ok, false, "an L4 product on the H100 pool")
    eq(msg, "no node of pool h100, where gpuguard placed the pod, has its nodeSelector "
        .. "nvidia.com/gpu.product=NVIDIA-L4; pools that do: l4; change it or ask for one of them", "the pools that do")
end

T["candidates: a class's own pools in order, whole GPUs to its exclusive ones first"] = function()
    local cfg = fleet_cfg()
    local function names(list)
        local out = {}
        for i, c in ipairs(list) do
            out[i] = c.pool.name .. (c.sized and "*" or "")
        end
        return table.concat(out, " ")
    end
    local list = fleet.candidates(cfg, "inference", nil, false)
    eq(names(list), "a100-mig l4 l4-ts", "a fraction")
    eq(list.named, true, "named")
    eq(names(fleet.candidates(cfg, "inference", nil, true)), "l4* a100-mig l4-ts", "whole GPUs")
    eq(names(fleet.candidates(cfg, "inference", "time-slicing", false)), "l4-ts", "a mode asked for")
    list = fleet.candidates(cfg, "batch", nil, true)
    eq(names(list), "h100* l4* l4-ts", "a class without pools: the fleet's, by mode")
    eq(list.named, false, "not named")
    local none, msg = fleet.candidates(cfg, "inference", "mps", false)
    eq(none, nil, "mps is not a mode of inference")
    eq(msg, "class inference may use mig, time-slicing, exclusive, not mps; remove gpuguard.io/sharing or ask for one of those",
        "why")
end

T["placed: the first pool that holds it, or the cheapest by charge x cost"] = function()
    local ANY = { max_charge = 1000000 }
    local cfg = fleet_cfg()
    local list = fleet.candidates(cfg, "inference", nil, false)
    local first = rightsize.placed(cfg, list, 9 * GIB)
    eq(first.pool.name .. " " .. first.name, "a100-mig mig-1g.10gb", "routed")
    local cheapest = rightsize.placed(cfg, list, 9 * GIB, ANY)
    eq(cheapest.pool.name, "a100-mig", "0.143 x 2 beats an L4 share of 0.375")
    eq(cheapest.cost, 286, "its cost")
    cfg.pools[2].cost = 3 -- 0.429: the L4 share is cheaper now
    cheapest = rightsize.placed(cfg, list, 9 * GIB, ANY)
    eq(cheapest.pool.name .. " " .. cheapest.name, "l4-ts 0.375 of a L4", "the share")
    eq(rightsize.placed(cfg, list, 200 * GIB, ANY).name, "9 whole L4", "only whole L4s hold 200 GiB")
    cfg.pools[2].cost = 1
    eq(rightsize.placed(cfg, list, 9 * GIB, { max_charge = 100 }), nil, "never more than max_charge")
end

return T
