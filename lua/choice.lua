--[[
choice.lua - the pool a pod asks for, and whether the nodes of a pool can run a pod.

The node labels gpuguard knows of each pool are its node_selector and the GPU Feature Discovery
labels of its model as GFD publishes them for the pool's sharing set-up:

  nvidia.com/gpu.product   the model's products (gpu.lua); under MIG single the product of the
                           slice (NVIDIA-A100-SXM4-80GB-MIG-1g.10gb); on a time-slicing or MPS
                           pool that does not rename its replicas, the product with -SHARED
  nvidia.com/gpu.memory    MiB of one GPU (of the slice under MIG single) as NVML counts it, a
                           little under the catalog's figure (81559 for 80 GB): known as the
                           range from 90% of the figure to the figure
  nvidia.com/gpu.family    the model's architecture (ampere, hopper, ada-lovelace, ...)

A pod picks among pools by these labels, in its nodeSelector or in the required terms of its
node affinity (In, NotIn, Exists, DoesNotExist, Gt, Lt), or by the annotation
gpuguard.io/gpu-model (a model name, alias or GFD product; "A100" means either A100).  gpuguard's
own annotations (pool, decision, charge) are never read as a choice, nor the nodeSelector entries
it wrote itself (gpuguard.io/node-selector lists them; forget_own takes them out before a new
decision).  A key gpuguard does not
know for a pool (a zone, a hostname, a custom label) is no choice and is not judged: whether the
pool's nodes carry it is not gpuguard's to know.

Must not: write into the pod or the configuration.
]]

local k8s = require "k8s"
local gpu = require "gpu"
local fleet = require "fleet"

local M = {}

M.MODEL_ANNOTATION = "gpuguard.io/gpu-model"
-- The nodeSelector entries gpuguard itself wrote at its last decision, "key=value,...": its
-- output, which a later decision (a template whose request changed) must not read as a choice.
M.OWN_SELECTOR = "gpuguard.io/node-selector"
local PRODUCT, MEMORY, FAMILY = "nvidia.com/gpu.product", "nvidia.com/gpu.memory", "nvidia.com/gpu.family"
local NONE = {}

-- A label known as a set of values: { list = {...}, set = {[v] = true} }.
local function values(list)
    local set = {}
    for _, v in ipairs(list) do
        set[v] = true
    end
    return { list = list, set = set }
end

-- The GFD product values of pool's nodes.
local function products(pool, model)
    local base = pool.product and { pool.product } or model.products
    local out = {}
    for i, p in ipairs(base) do
        if pool.sharing == "mig" and pool.mig_strategy == "single" then
            out[i] = gpu.mig_product_label(model, pool.mig_profile, p)
        elseif (pool.sharing == "time-slicing" or pool.sharing == "mps")
            and (pool.shared_resource or "nvidia.com/gpu") == "nvidia.com/gpu" then
            out[i] = p .. "-SHARED"
        else
            out[i] = p
        end
    end
    return out
end

-- The labels of one pool: key -> { list, set } or { lo, hi } (MiB, for the memory label).
-- The pool's node_selector wins over what gpuguard works out from its model: it is what the
-- platform team says the nodes carry.
local function pool_labels(cfg, pool)
    local out = {}
    local model = fleet.model(cfg, pool)
    if model then
        out[PRODUCT] = values(products(pool, model))
        local mib = model.memory_mib
        if pool.sharing == "mig" and pool.mig_strategy == "single" then
            mib = gpu.profile(model, pool.mig_profile).memory_mib
        end
        out[MEMORY] = { lo = mib * 9 // 10, hi = mib }
        if model.family then
            out[FAMILY] = values({ model.family })
        end
    end
    for k, v in pairs(pool.node_selector or NONE) do
        out[k] = values({ v })
    end
    return out
end

-- Labels of every pool ([pool] = labels) and the keys any pool knows (a set), per configuration.
local labels_of = fleet.per_config(function(cfg)
    local by_pool, known = {}, {}
    for _, p in ipairs(fleet.pools(cfg)) do
        local l = pool_labels(cfg, p)
        by_pool[p] = l
        for k in pairs(l) do
            known[k] = true
        end
    end
    return { by_pool = by_pool, known = known }
end)

local function integer(s)
    local n = type(s) == "string" and s:match("^%-?%d+$") and tonumber(s)
    return math.type(n) == "integer" and n or nil
end

local function list_of(v)
    return type(v) == "table" and v or NONE
end

-- Can a node with label l satisfy the requirement op(vals)?  l nil: the pool's nodes may or may
-- not carry the key; true.
local function satisfies(l, op, vals)
    if l == nil then
        return true
    elseif op == "Exists" then
        return true
    elseif op == "DoesNotExist" then
        return false
    end
    vals = list_of(vals)
    if l.lo then -- a range of MiB
        if op == "In" then
            for _, v in ipairs(vals) do
                local n = integer(v)
                if n and n >= l.lo and n <= l.hi then
                    return true
                end
            end
            return false
        elseif op == "NotIn" then
            return true -- the range holds more values than any list names
        end
        local n = integer(vals[1])
        if #vals ~= 1 or not n then
            return false -- the API server refuses these; no node matches them either
        end
        return (op == "Gt" and l.hi > n) or (op == "Lt" and l.lo < n)
    end
    local listed = {}
    for _, v in ipairs(vals) do
        listed[v] = true
    end
    for _, have in ipairs(l.list) do
        if op == "In" and listed[have] or op == "NotIn" and not listed[have] then
            return true
        end
        local n, limit = integer(have), integer(vals[1])
        if n and limit and #vals == 1 and (op == "Gt" and n > limit or op == "Lt" and n < limit) then
            return true
        end
    end
    return false
end

-- "nvidia.com/gpu.product=NVIDIA-L4" or "nvidia.com/gpu.memory Gt 40000".
local function requirement(e)
    local vals = list_of(e.values)
    if e.operator == "In" and #vals == 1 then
        return string.format("%s=%s", e.key, tostring(vals[1]))
    end
    local shown = {}
    for i, v in ipairs(vals) do
        shown[i] = tostring(v)
    end
    return string.format("%s %s %s", e.key, tostring(e.operator), table.concat(shown, ","))
end

--[[
Whether pool's nodes can satisfy spec's nodeSelector and required node affinity on the keys
gpuguard knows for it: true, or false and what fails ("nodeSelector nvidia.com/gpu.product=
NVIDIA-L4"; for affinity, the first failing requirement of the first term).
]]
local function selectors_fit(spec, labels)
    for k, v in pairs(list_of(spec.nodeSelector)) do
        if type(v) == "string" and not satisfies(labels[k], "In", { v }) then
            return false, string.format("nodeSelector %s=%s", k, v)
        end
    end
    local terms = fleet.required_terms(spec)
    if #terms == 0 then
        return true
    end
    local first
    for _, term in ipairs(terms) do
        local failed
        for _, e in ipairs(list_of(type(term) == "table" and term.matchExpressions)) do
            if type(e) == "table" and type(e.key) == "string" and not satisfies(labels[e.key], e.operator, e.values) then
                failed = e
                break
            end
        end
        if not failed then
            return true
        end
        first = first or failed
    end
    return false, "required node affinity " .. requirement(first)
end

--[[
The choice a pod makes, or nil when it makes none: { model = the annotation's value or nil,
models = {[canonical name] = true} for it, says = "nodeSelector gpuguard.io/pool=l4-infer"
(what the pod says, for messages) }.  false and a message when the annotation names no model.
]]
function M.of(pod, spec, cfg)
    local known = labels_of(cfg).known
    local says = {}
    for k, v in pairs(list_of(spec.nodeSelector)) do
        if known[k] then
            says[#says + 1] = string.format("nodeSelector %s=%s", k, tostring(v))
        end
    end
    table.sort(says)
    for _, term in ipairs(fleet.required_terms(spec)) do
        for _, e in ipairs(list_of(type(term) == "table" and term.matchExpressions)) do
            if type(e) == "table" and known[e.key] then
                says[#says + 1] = "required node affinity " .. requirement(e)
            end
        end
    end
    local name = k8s.annotation(pod, M.MODEL_ANNOTATION)
    local models
    if name ~= nil then
        local found = type(name) == "string" and name ~= "" and gpu.models_named(name, fleet.catalog(cfg)) or NONE
        if #found == 0 then
            local have = {}
            for _, p in ipairs(fleet.pools(cfg)) do
                have[#have + 1] = string.format("%s (pool %s)", p.model, p.name)
            end
            return false, string.format("annotation %s: %s is not a GPU model gpuguard knows; the pools have %s",
                M.MODEL_ANNOTATION, tostring(name), table.concat(have, ", "))
        end
        models = {}
        for _, m in ipairs(found) do
            models[m] = true
        end
        says[#says + 1] = string.format("annotation %s=%s", M.MODEL_ANNOTATION, name)
    end
    if #says == 0 then
        return nil
    end
    return { models = models, says = table.concat(says, ", ") }
end

--- Does pool satisfy choice (from M.of) for the pod's spec?  true, or false and what fails.
function M.allows(choice, spec, cfg, pool)
    if choice.models then
        local model = fleet.model(cfg, pool)
        if not (model and choice.models[model.name]) then
            return false, string.format("annotation %s", M.MODEL_ANNOTATION)
        end
    end
    return selectors_fit(spec, labels_of(cfg).by_pool[pool] or NONE)
end

--- Remove from spec's nodeSelector the entries an earlier decision of gpuguard wrote (listed in
--- gpuguard.io/node-selector, still with that value): they are no choice of the pod's, and the
--- decision about to be made writes its own.
function M.forget_own(pod, spec)
    local listed = k8s.annotation(pod, M.OWN_SELECTOR)
    local ns = spec.nodeSelector
    if type(listed) ~= "string" or type(ns) ~= "table" then
        return
    end
    for k, v in listed:gmatch("([^,=]+)=([^,]*)") do
        if ns[k] == v then
            k8s.remove_node_selector(spec, k)
        end
    end
end

--- The gpuguard.io/node-selector value for the entries of writes (a map) that spec's
--- nodeSelector does not hold yet with that value, sorted; nil when there are none.
function M.own_entries(spec, writes)
    local ns = list_of(spec.nodeSelector)
    local out = {}
    for k, v in pairs(writes) do
        if ns[k] ~= v then
            out[#out + 1] = k .. "=" .. v
        end
    end
    table.sort(out)
    return #out > 0 and table.concat(out, ",") or nil
end

--- Does the pod's own nodeSelector value for key already pick pool's nodes?  (Then a backend's
--- selector for that key, such as the MIG product under the single strategy, keeps it: the pod
--- may name the PCIe product of a model whose first product is SXM.)
function M.keeps(spec, cfg, pool, key)
    local v = list_of(spec.nodeSelector)[key]
    local l = labels_of(cfg).by_pool[pool]
    return type(v) == "string" and l ~= nil and l[key] ~= nil and satisfies(l[key], "In", { v })
end

--- The names of the fleet's pools that satisfy choice, as "a, b" ("none" when none does).
function M.pools_that_would(choice, spec, cfg)
    local out = {}
    for _, p in ipairs(fleet.pools(cfg)) do
        if M.allows(choice, spec, cfg, p) then
            out[#out + 1] = p.name
        end
    end
    return #out > 0 and table.concat(out, ", ") or nil
end

--[[
The candidates (fleet.candidates' entries) the pod's own choice allows, in order: all of them when
it makes none.  nil and a message when it makes one none of them satisfies, naming the pools that
would; or when its gpu-model annotation names no model.
]]
function M.pick(pod, spec, cfg, candidates, class)
    local choice, msg = M.of(pod, spec, cfg)
    if choice == false then
        return nil, msg
    elseif not choice then
        return candidates
    end
    local out, names = { named = candidates.named }, {}
    for _, c in ipairs(candidates) do
        if M.allows(choice, spec, cfg, c.pool) then
            out[#out + 1] = c
        end
        names[#names + 1] = c.pool.name
    end
    if #out > 0 then
        return out
    end
    local others = M.pools_that_would(choice, spec, cfg)
    return nil, string.format("the pod asks for %s, which no pool of class %s (%s) has; %s", choice.says, class,
        table.concat(names, ", "), others
            and "pools that do: " .. others .. "; change the request or use a class that runs on them"
            or "no pool has it; remove it")
end

-- The first NoSchedule or NoExecute taint of pool that no toleration of spec tolerates.
local function untolerated(spec, pool)
    for _, taint in ipairs(pool.taints or NONE) do
        if taint.effect ~= "PreferNoSchedule" then
            local ok = false
            for _, tol in ipairs(list_of(spec.tolerations)) do
                if type(tol) == "table" and fleet.tolerates(tol, taint) then
                    ok = true
                    break
                end
            end
            if not ok then
                return taint
            end
        end
    end
    return nil
end

--[[
Can a node of pool run the pod as it stands?  Its selectors and required affinity on the keys
gpuguard knows, its tolerations of the pool's taints, and its gpu-model annotation.  true, or
false and a message that says what to change.
]]
function M.runnable(pod, spec, cfg, pool)
    local taint = untolerated(spec, pool)
    if taint then
        return false, string.format("no node of pool %s can run the pod: it does not tolerate the taint %s=%s:%s",
            pool.name, taint.key, tostring(taint.value or ""), tostring(taint.effect))
    end
    local choice, msg = M.of(pod, spec, cfg)
    if choice == false then
        return false, msg
    elseif not choice then
        return true
    end
    local ok, what = M.allows(choice, spec, cfg, pool)
    if ok then
        return true
    end
    -- The pools that would, judged on the pod without the node selector gpuguard wrote for pool.
    local own = {}
    for k, v in pairs(list_of(spec.nodeSelector)) do
        if (pool.node_selector or NONE)[k] ~= v then
            own[k] = v
        end
    end
    local others = M.pools_that_would(choice, { nodeSelector = own, affinity = spec.affinity }, cfg)
    return false, string.format("no node of pool %s, where gpuguard placed the pod, has its %s; %s",
        pool.name, what, others and "pools that do: " .. others .. "; change it or ask for one of them"
            or "no pool has it; remove it")
end

return M
