--[[
40-gpu-quota.lua - GPU quotas in GPU-equivalents.

A whole GPU is 1; a MIG slice is its compute fraction of the GPU (1g of 7 = 0.143); a shared
replica is the fraction it was given.  Every GPU pod, in any dialect (DRA claims, KAI, HAMi,
Volcano vGPU, device plugin), is charged by intent.charge, the model the inventory also charges
running pods with; a charge that cannot be computed (an illegal value, a missing claim
template) is a denial with the reason.
Usage comes from the inventory (gpuguard.usage): the cluster's pods in the server, a
--cluster-state snapshot in the CLI, plus the pods this replica admitted a moment ago.

validate: deny when the pod alone is over quotas.max_per_pod or the per-pod maximum of its class
          (quotas.per_class), or when the namespace would go over its quota: its GPUQuota
          object's spec.hard (and the pool's, spec.hard.pools, for the pool the pod is placed
          in), else quotas.namespaces.<ns>, else quotas.default; exactly at the quota is allowed.
          A namespace with several GPUQuotas is denied: keep one.  In the server, a namespace
          with a GPUQuota is also held exactly by its ledger once the policies admit a pod
          (docs/quotas.md); this check is the same rule against the usage this replica sees.
          Until the inventory has synced, quotas.inventory_not_ready decides: allow with a
          warning (default) or deny; a pod alone over its namespace's quota is denied even then.

Config keys: quotas.default, quotas.namespaces, quotas.max_per_pod, quotas.per_class,
quotas.inventory_not_ready; pools (to charge MIG and shared resources).
]]

local gg = require "gpuguard"
local k8s = require "k8s"
local quota = require "quota"
local intent = require "intent"
local workload = require "workload"

local AMOUNT = { allow_above_one = true, allow_zero = true }

-- Amounts from the configuration, parsed once per VM: validate reads them on every review.
local parsed = {}

local function gpus(v, where)
    if parsed[v] then
        return parsed[v]
    end
    local milli, msg = quota.parse_fraction(v, AMOUNT)
    if not milli then
        error(where .. ": " .. msg, 0)
    end
    parsed[v] = milli
    return milli
end

local function check_limits(req, charge, class, q)
    if q.max_per_pod ~= nil then
        local max = gpus(q.max_per_pod, "quotas.max_per_pod")
        if charge > max then
            req:deny(string.format("the pod needs %s GPUs, more than the %s allowed per pod; ask for less",
                quota.format_gpus(charge), quota.format_gpus(max)))
            return false
        end
    end
    local per_class = q.per_class and q.per_class[class]
    if per_class ~= nil then
        local max = gpus(per_class, "quotas.per_class." .. class)
        if charge > max then
            req:deny(string.format("class %s pods may use %s %s each and this one needs %s; ask for less",
                class, quota.format_gpus(max), max == 1000 and "GPU" or "GPUs", quota.format_gpus(charge)))
            return false
        end
    end
    return true
end

-- The namespace's limit in milli-GPU, and how messages name it: its GPUQuota's, else the
-- configuration's (nil: none).
local function limit_of(ns, q, gq)
    if gq then
        return gq.hard, "namespace " .. ns .. " (GPUQuota " .. gq.name .. ")"
    end
    local limit = q and (q.namespaces and q.namespaces[ns] or q.default)
    return limit ~= nil and gpus(limit, "quotas") or nil, "namespace " .. ns
end

local function validate(req, pod, cfg)
    if req.background and req.template then
        -- The audit of a running workload: its pods are judged one by one, each against the
        -- others; its template as one more pod would count its own pods twice.
        return
    end
    local q = cfg.quotas
    local spec = k8s.pod_spec(pod)
    if spec == nil or not workload.wants_gpu(pod, cfg, req.namespace) then
        return
    end
    local gq, several = gg.gpuquota(req.namespace)
    if several then
        req:deny(several)
        return
    end
    if q == nil and gq == nil then
        return
    end
    local charge, msg = intent.charge(pod, cfg, { namespace = req.namespace })
    if not charge then
        req:deny(msg)
        return
    end
    local class = workload.class(pod, cfg)
    if q ~= nil and not check_limits(req, charge, class, q) then
        return
    end
    local limit, scope = limit_of(req.namespace, q, gq)
    if limit == nil then
        return
    end
    local used, ready, state = gg.usage(req.namespace)
    if not ready then
        -- A pod that alone is over the quota never fits, whatever the usage.
        local fits, why = quota.check(0, charge, limit, scope)
        if not fits then
            req:deny(why)
            return
        end
        if state == "off" then -- said once at start, and gpuguard_quota_enforced is 0
            return
        end
        if q and q.inventory_not_ready == "deny" then
            req:deny("GPU usage is not known yet (the inventory has not synced); try again in a minute")
        else
            req:warn("GPU quota not checked: the inventory has not synced yet")
        end
        return
    end
    local ok, why = quota.check(used, charge, limit, scope)
    if not ok then
        req:deny(why)
        return
    end
    local pool = k8s.annotation(pod, intent.POOL)
    local pool_limit = gq and pool and gq.pools[pool]
    if pool_limit then
        ok, why = quota.check((gg.usage(req.namespace, nil, pool)), charge, pool_limit,
            "pool " .. pool .. " of " .. scope)
        if not ok then
            req:deny(why)
        end
    end
end

return {
    name = "gpu-quota",
    description = "Namespace GPU quotas in GPU-equivalents.",
    match = { kinds = { "Pod" }, operations = { "CREATE" } },
    check = function(cfg)
        local q = cfg.quotas
        if q == nil then
            return
        end
        if q.default ~= nil then
            gpus(q.default, "quotas.default")
        end
        for ns, v in pairs(q.namespaces or {}) do
            gpus(v, "quotas.namespaces." .. ns)
        end
        if q.max_per_pod ~= nil then
            gpus(q.max_per_pod, "quotas.max_per_pod")
        end
        for class, v in pairs(q.per_class or {}) do
            gpus(v, "quotas.per_class." .. class)
        end
        if q.inventory_not_ready ~= nil and q.inventory_not_ready ~= "allow" and q.inventory_not_ready ~= "deny" then
            error("quotas.inventory_not_ready: must be allow or deny", 0)
        end
    end,
    validate = validate,
}
