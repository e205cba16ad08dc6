--[[
50-gpu-claims.lua - DRA ResourceClaims and ResourceClaimTemplates at creation.

validate (CREATE, and a claim's UPDATE that adds one of the annotations below; claims and
templates of GPU device classes only, see intent.class_unit):
  * a request for every device of a class (allocationMode: All) is denied, unless
    dra.allocation_all gives such a request a charge;
  * a claim or template charged more than quotas.max_per_pod is denied: a pod using it could
    never be admitted;
  * a ResourceClaim that pods will share is charged to its namespace once, here (its pods are
    charged nothing): denied when the namespace would go over its quota.
Claims generated from a pod's template (annotation resource.kubernetes.io/pod-claim-name) and
the scheduler's claims for extended resources were charged with their pod: left alone, since
denying them would only leave an admitted pod pending.  Only the Kubernetes components that make
them may create a claim with those annotations (CLAIM_MAKERS): the inventory charges such a claim
nothing, so anyone else's would hold devices uncharged, and an UPDATE may not add them either.

Config keys: dra.classes, dra.allocation_all, quotas.max_per_pod, quotas.namespaces,
quotas.default, quotas.inventory_not_ready.
]]

local gg = require "gpuguard"
local quota = require "quota"
local intent = require "intent"

local AMOUNT = { allow_above_one = true, allow_zero = true }

-- Who makes claims charged elsewhere: kube-controller-manager's resource claim controller (with
-- its own service account, or the manager's credentials) for a pod's resourceClaimTemplateName,
-- and the scheduler for extended resources backed by DRA.
local CLAIM_MAKERS = {
    ["system:serviceaccount:kube-system:resource-claim-controller"] = true,
    ["system:kube-controller-manager"] = true,
    ["system:kube-scheduler"] = true,
}

-- A quota amount of the configuration in milli-GPU (40-gpu-quota checks them when loading).
local function gpus(v)
    return (quota.parse_fraction(v, AMOUNT))
end

local function validate(req, obj, cfg)
    local template = req.kind == "ResourceClaimTemplate"
    -- A claim made for a pod counts nothing on its own: only its makers may create one, or
    -- mark one so by UPDATE (which changes no device: a claim's spec is immutable).
    local update = req.operation == "UPDATE"
    local marked = not template and intent.claim_charged_elsewhere(obj)
        and not (update and intent.claim_charged_elsewhere(req.old_object))
    if marked then
        if not CLAIM_MAKERS[(req.user or {}).username] then
            req:deny(string.format("the annotations %s and %s are for the claims Kubernetes makes for a pod's resourceClaimTemplateName and for extended resources, which are charged with their pod; remove them, and the claim is charged to the namespace",
                intent.POD_CLAIM_NAME, intent.EXTENDED_RESOURCE_CLAIM))
        end
        return
    elseif update then
        return
    end
    local spec = type(obj.spec) == "table" and obj.spec
    if template then
        spec = spec and spec.spec
    end
    local name = type(obj.metadata) == "table" and obj.metadata.name or req.name
    local charge, classes = intent.claim_charge(cfg, spec, req.kind .. " " .. tostring(name))
    if not charge then
        req:deny(classes)
        return
    end
    if #classes == 0 then
        return -- no GPU device class: not gpuguard's business
    end
    local q = cfg.quotas
    local max = q and q.max_per_pod ~= nil and gpus(q.max_per_pod)
    if max and charge > max then
        req:deny(string.format("the %s asks for %s GPUs, more than the %s allowed per pod; ask for fewer devices",
            template and "template" or "claim", quota.format_gpus(charge), quota.format_gpus(max)))
        return
    end
    local limit = q and (q.namespaces and q.namespaces[req.namespace] or q.default)
    if template or limit == nil then
        return
    end
    local used, ready, state = gg.usage(req.namespace)
    if not ready and state == "syncing" and q.inventory_not_ready == "deny" then
        req:deny("GPU usage is not known yet (the inventory has not synced); try again in a minute")
        return
    end
    local ok, why = quota.check(ready and used or 0, charge, gpus(limit), "namespace " .. req.namespace)
    if not ok then
        req:deny((why:gsub("this pod", "this claim")))
    end
end

return {
    name = "gpu-claims",
    description = "DRA claims and claim templates for GPUs: no All requests, within the quotas.",
    match = { kinds = { "ResourceClaim", "ResourceClaimTemplate" }, operations = { "CREATE", "UPDATE" } },
    validate = validate,
}
