--[[
20-gpu-placement.lua - keep pods and GPU node taints straight.

mutate:   a GPU pod placed in a pool by 10-gpu-sharing (annotation gpuguard.io/pool) gets the
          pool's nodeSelector and a toleration for each of the pool's taints, unless an
          equivalent toleration is already there (the ExtendedResourceToleration admission
          plugin adds one for nvidia.com/gpu on some clusters; MIG resource names never get it).
          With placement.spot, a pod marked gpuguard.io/checkpointable: "true" also tolerates
          the spot taint and prefers spot nodes.
validate: a GPU pod that no node of its pool can run (a nodeSelector, required node affinity or
          gpuguard.io/gpu-model of its own that the pool's nodes do not match: choice.lua) is
          denied.  A pod that asks for no GPU but tolerates a GPU pool's taint or selects GPU nodes
          (nodeSelector, or a required node affinity term, on a pool's label or on a GPU node
          label of GFD or the GPU Operator: nvidia.com/gpu.*, nvidia.com/mig*) would hold a GPU
          node's CPU and memory; it is denied (or warned, placement.non_gpu_pods: warn).  Pods in
          placement.exempt_namespaces or running as one of placement.exempt_service_accounts
          are left alone.

Config keys: pools (node_selector, taints), placement.non_gpu_pods (deny | warn),
placement.exempt_namespaces, placement.exempt_service_accounts, placement.spot {taint,
node_selector, weight}.
]]

local gg = require "gpuguard"
local k8s = require "k8s"
local fleet = require "fleet"
local workload = require "workload"
local intent = require "intent"
local choice = require "choice"

local POOL = intent.POOL
local CHECKPOINTABLE = "gpuguard.io/checkpointable"

-- The toleration of each configured taint, made once per VM: add_toleration only reads it.
local tolerations = setmetatable({}, { __mode = "k" })

local function toleration_for(taint)
    local t = tolerations[taint]
    if not t then
        t = { key = taint.key, effect = taint.effect }
        if taint.value ~= nil then
            t.operator, t.value = "Equal", taint.value
        else
            t.operator = "Exists"
        end
        tolerations[taint] = t
    end
    return t
end

local function add_spot(pod, spec, cfg)
    local spot = cfg.placement and cfg.placement.spot
    if not spot or k8s.annotation(pod, CHECKPOINTABLE) ~= "true" then
        return
    end
    if spot.taint then
        k8s.add_toleration(spec, toleration_for(spot.taint))
    end
    if not spot.node_selector then
        return
    end
    local exprs = gg.array()
    for k, v in pairs(spot.node_selector) do
        exprs[#exprs + 1] = { key = k, operator = "In", values = gg.array { v } }
    end
    table.sort(exprs, function(a, b) return a.key < b.key end)
    local term = { weight = spot.weight or 50, preference = { matchExpressions = exprs } }
    spec.affinity = spec.affinity or gg.object()
    local na = spec.affinity.nodeAffinity or gg.object()
    spec.affinity.nodeAffinity = na
    local prefs = na.preferredDuringSchedulingIgnoredDuringExecution or gg.array()
    na.preferredDuringSchedulingIgnoredDuringExecution = prefs
    for _, p in ipairs(prefs) do
        if p.preference and p.preference.matchExpressions and #p.preference.matchExpressions == #exprs then
            local same = true
            for i, e in ipairs(exprs) do
                local o = p.preference.matchExpressions[i]
                same = same and o.key == e.key and o.operator == "In" and o.values and o.values[1] == e.values[1]
            end
            if same then
                return
            end
        end
    end
    prefs[#prefs + 1] = term
end

local function place(req, pod, cfg)
    local spec = k8s.pod_spec(pod)
    local pool = spec and fleet.pool(cfg, k8s.annotation(pod, POOL))
    if not pool then
        return
    end
    for k, v in pairs(fleet.places(pool) and pool.node_selector or {}) do
        k8s.set_node_selector(spec, k, v)
    end
    for _, taint in ipairs(pool.taints or {}) do
        k8s.add_toleration(spec, toleration_for(taint))
    end
    add_spot(pod, spec, cfg)
    req:audit("pool", pool.name)
end

-- What ties a pod without a GPU to GPU nodes, or nil: the reason, the fix, and both in a form
-- short enough for a warning (the API server's limit is 120 characters; longer ones are cut).
local function gpu_ties(spec, cfg)
    local tie = fleet.gpu_ties(spec, cfg)[1]
    if not tie then
        return nil
    end
    -- which GPU nodes: a pool's, or any node with a GPU label of GFD or the GPU Operator
    local whose = tie.pool and "pool " .. tie.pool or "a GPU node label"
    if tie.what == "toleration" then
        return string.format("it tolerates the GPU taint %s of pool %s", tie.key, tie.pool),
            "remove that toleration",
            string.format("tolerates GPU taint %s (pool %s)", tie.key, tie.pool)
    elseif tie.what == "nodeSelector" then
        return string.format("it selects GPU nodes (%s=%s, %s)", tie.key, tie.value, whose),
            "remove that nodeSelector",
            string.format("selects GPU nodes (%s=%s)", tie.key, tie.value)
    end
    return string.format("its required node affinity selects GPU nodes (%s=%s, %s)", tie.key, tie.value, whose),
        "remove that affinity term",
        string.format("affinity selects GPU nodes (%s=%s)", tie.key, tie.value)
end

-- A GPU pod placed in a pool must be one a node of that pool can run (choice.runnable): a
-- selector, affinity or gpu-model of its own that the pool's nodes do not match would leave it
-- Pending for ever, with nothing to say why.
local function check_runnable(req, pod, cfg)
    local pool = fleet.pool(cfg, k8s.annotation(pod, POOL))
    if not pool then
        return
    end
    local ok, msg = choice.runnable(pod, k8s.pod_spec(pod), cfg, pool)
    if not ok then
        req:deny(msg)
    end
end

local function check(req, pod, cfg)
    if workload.wants_gpu(pod, cfg, req.namespace) then -- first: settled for a GPU pod, which needs no pod_spec call
        return check_runnable(req, pod, cfg)
    end
    local spec = k8s.pod_spec(pod)
    if not spec or workload.exempt(pod, req.namespace, cfg) then
        return
    end
    local why, fix, short = gpu_ties(spec, cfg)
    if not why then
        return
    end
    if cfg.placement and cfg.placement.non_gpu_pods == "warn" then
        req:warn(string.format("asks for no GPU but %s; remove it or ask for a GPU", short))
    else
        req:deny(string.format("the pod asks for no GPU but %s; %s, or ask for a GPU%s", why, fix,
            workload.EXEMPT_HINT))
    end
end

return {
    name = "gpu-placement",
    description = "GPU pods get their pool's selector and tolerations; other pods stay off GPU nodes.",
    match = { kinds = { "Pod" }, operations = { "CREATE" } },
    remember = { "validate" }, -- its validate judges the request and the configuration alone
    check = function(cfg)
        local p = cfg.placement
        if p == nil then
            return
        end
        if p.non_gpu_pods ~= nil and p.non_gpu_pods ~= "deny" and p.non_gpu_pods ~= "warn" then
            error("placement.non_gpu_pods: must be deny or warn", 0)
        end
        if p.exempt_namespaces ~= nil and not gg.is_array(p.exempt_namespaces) then
            error("placement.exempt_namespaces: must be a list of namespaces", 0)
        end
        if p.exempt_service_accounts ~= nil then
            if not gg.is_array(p.exempt_service_accounts) then
                error("placement.exempt_service_accounts: must be a list of namespace/name", 0)
            end
            for i, a in ipairs(p.exempt_service_accounts) do
                if type(a) ~= "string" or not a:match("^[^/]+/[^/]+$") then
                    error(string.format("placement.exempt_service_accounts[%d]: must be namespace/name", i), 0)
                end
            end
        end
        if p.spot ~= nil and p.spot.taint ~= nil and type(p.spot.taint.key) ~= "string" then
            error("placement.spot.taint.key: must be a string", 0)
        end
    end,
    mutate = place,
    validate = check,
}
