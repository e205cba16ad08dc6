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
  nvidia.com/gpu.sharing-strategy   time-slicing or mps on such pools, none on the others

Pools are disjoint sets of nodes: a key one pool's node_selector names is known for the others
too, as any value but the ones the pools naming it use.

A pod picks among pools by these labels, in its nodeSelector or in the required terms of its
node affinity (In, NotIn, Exists, DoesNotExist, Gt, Lt; the requirements on one key are judged
together, as one node's label must meet them all; an empty term matches no node), or by the
annotation gpuguard.io/gpu-model (a model name, alias or GFD product; "A100" means either
A100).  gpuguard's own annotations (pool, decision, charge) are never read as a choice, nor the
nodeSelector entries it wrote itself: gpuguard.io/node-selector lists them, and only entries
gpuguard could have written (a pool's node_selector, its sharing strategy, a MIG product under
the single strategy) are taken from that list.  A key gpuguard does not know (a zone, a hostname,
a custom label) is no choice and is not judged: whether the pool's nodes carry it is not
gpuguard's to know.

Must not: write into the configuration; into the pod only forget_own and disown, which take
out the entries an earlier decision wrote, and take a pin of right-sizing's off that list.
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
local SHARING = "nvidia.com/gpu.sharing-strategy"
local SHARED_MODES = { ["time-slicing"] = true, mps = true }
local SHOWN_VALUES = 3 -- values of one requirement in a message
local SAYS_MAX = 300 -- characters of what a pod asks for, in a message
local NONE = {}

local function list_of(v)
    return type(v) == "table" and v or NONE
end

-- A label known as a set of values (a node carries one of them): { list = {...}, set = {...} }.
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
        elseif SHARED_MODES[pool.sharing] and (pool.shared_resource or "nvidia.com/gpu") == "nvidia.com/gpu" then
            out[i] = p .. "-SHARED"
        else
            out[i] = p
        end
    end
    return out
end

-- The labels of one pool: key -> { list, set }, or { lo, hi } (MiB, for the memory label).  The
-- pool's node_selector wins over what gpuguard works out from its model: it is what the
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
    out[SHARING] = values({ SHARED_MODES[pool.sharing] and pool.sharing or "none" })
    for k, v in pairs(pool.node_selector or NONE) do
        out[k] = values({ v })
    end
    return out
end

--[[
Per configuration: the labels of every pool ([pool] = labels; a key another pool's node_selector
names, and this one's does not, as { except = {[value] = true} }), the keys any pool knows (a
set), and the entries gpuguard writes itself (writable[key][value]).
]]
local labels_of = fleet.per_config(function(cfg)
    local by_pool, known, writable = {}, {}, { [SHARING] = { ["time-slicing"] = true, mps = true } }
    local pools = fleet.pools(cfg)
    for _, p in ipairs(pools) do
        by_pool[p] = pool_labels(cfg, p)
        for k, v in pairs(p.node_selector or NONE) do
            writable[k] = writable[k] or {}
            writable[k][v] = true
        end
        if p.sharing == "mig" and p.mig_strategy == "single" then
            writable[PRODUCT] = writable[PRODUCT] or {}
            for _, v in ipairs(by_pool[p][PRODUCT].list) do
                writable[PRODUCT][v] = true
            end
        end
    end
    for _, p in ipairs(pools) do
        for k, v in pairs(p.node_selector or NONE) do
            for _, other in ipairs(pools) do
                local l = by_pool[other]
                if l[k] == nil then
                    l[k] = { except = {} }
                end
                if l[k].except then
                    l[k].except[v] = true
                end
            end
        end
    end
    for _, l in pairs(by_pool) do
        for k in pairs(l) do
            known[k] = true
        end
    end
    return { by_pool = by_pool, known = known, writable = writable }
end)

local function integer(s)
    local n = type(s) == "string" and s:match("^%-?%d+$") and tonumber(s)
    return math.type(n) == "integer" and n or nil
end

-- Does label value v meet requirement r ({ op, vals })?
local function meets(v, r)
    if r.op == "In" then
        return k8s.contains(r.vals, v)
    elseif r.op == "NotIn" then
        return not k8s.contains(r.vals, v)
    elseif r.op == "Exists" then
        return true
    elseif r.op == "Gt" or r.op == "Lt" then
        local n, limit = integer(v), #r.vals == 1 and integer(r.vals[1])
        return n ~= nil and limit and (r.op == "Gt" and n > limit or r.op == "Lt" and n < limit) or false
    end
    return false -- DoesNotExist, or an operator the API server refuses
end

-- Can one node of a pool whose label is known as l meet all of reqs (one key's requirements)?
local function satisfiable(l, reqs)
    if l.list then -- a node carries one of these values
        for _, v in ipairs(l.list) do
            local all = true
            for _, r in ipairs(reqs) do
                all = all and meets(v, r)
            end
            if all then
                return true
            end
        end
        return false
    end
    local present, absent, ins = false, false, nil
    for _, r in ipairs(reqs) do
        if r.op == "DoesNotExist" then
            absent = true
        elseif r.op ~= "NotIn" then
            present = true
        end
        if r.op == "In" then
            ins = ins or r.vals
        end
    end
    if l.except then -- any value but the other pools', or none
        if absent then
            return not present
        elseif ins then
            for _, v in ipairs(ins) do
                if not l.except[v] and satisfiable({ list = { v } }, reqs) then
                    return true
                end
            end
            return false
        end
        return true
    end
    -- a range of MiB
    if absent then
        return false
    end
    local lo, hi = l.lo, l.hi
    for _, r in ipairs(reqs) do
        if r.op == "Gt" or r.op == "Lt" then
            local n = #r.vals == 1 and integer(r.vals[1])
            if not n then
                return false -- the API server refuses these; no node matches them either
            end
            lo, hi = r.op == "Gt" and math.max(lo, n + 1) or lo, r.op == "Lt" and math.min(hi, n - 1) or hi
        end
    end
    if lo > hi then
        return false
    elseif not ins then
        return true -- a NotIn list cannot name every value of a range
    end
    for _, v in ipairs(ins) do
        local n = integer(v)
        if n and n >= lo and n <= hi and satisfiable({ list = { v } }, reqs) then
            return true
        end
    end
    return false
end

-- "nvidia.com/gpu.product=NVIDIA-L4" or "nvidia.com/gpu.memory Gt 40000": a requirement for
-- people, with at most SHOWN_VALUES values.
local function requirement(e)
    local vals = list_of(e.values)
    if e.operator == "In" and #vals == 1 then
        return string.format("%s=%s", tostring(e.key), tostring(vals[1]))
    end
    local shown = {}
    for i = 1, math.min(#vals, SHOWN_VALUES) do
        shown[i] = tostring(vals[i])
    end
    if #vals > SHOWN_VALUES then
        shown[#shown + 1] = "…"
    end
    return string.format("%s %s %s", tostring(e.key), tostring(e.operator), table.concat(shown, ","))
end

-- The entries of the pod's nodeSelector gpuguard wrote itself (gpuguard.io/node-selector, still
-- with that value and one gpuguard writes): { [key] = value }.
local function own_entries_of(pod, spec, cfg)
    local listed_text = k8s.annotation(pod, M.OWN_SELECTOR)
    local ns = spec.nodeSelector
    if type(listed_text) ~= "string" or type(ns) ~= "table" then
        return NONE
    end
    local writable, out = labels_of(cfg).writable, {}
    for k, v in listed_text:gmatch("([^,=]+)=([^,]*)") do
        if ns[k] == v and writable[k] and writable[k][v] then
            out[k] = v
        end
    end
    return out
end

-- The pod's own selectors, without the entries in own: { nodeSelector, affinity }.
local function users_spec(spec, own)
    if next(own) == nil then
        return spec
    end
    local ns = {}
    for k, v in pairs(list_of(spec.nodeSelector)) do
        if own[k] ~= v then
            ns[k] = v
        end
    end
    return { nodeSelector = ns, affinity = spec.affinity }
end

-- Requirements by key, { [key] = { {op, vals, shown}, ... } }, from spec's nodeSelector and one
-- term (or none) of its required node affinity; only keys gpuguard knows.
local function requirements(spec, term, known)
    local by_key = {}
    local function add(key, r)
        by_key[key] = by_key[key] or {}
        by_key[key][#by_key[key] + 1] = r
    end
    for k, v in pairs(list_of(spec.nodeSelector)) do
        if known[k] and type(v) == "string" then
            add(k, { op = "In", vals = { v }, shown = string.format("nodeSelector %s=%s", k, v) })
        end
    end
    for _, e in ipairs(list_of(term and term.matchExpressions)) do
        if type(e) == "table" and known[e.key] then
            add(e.key, { op = e.operator, vals = list_of(e.values), shown = "required node affinity " .. requirement(e) })
        end
    end
    return by_key
end

-- Can one node with labels meet every requirement of by_key?  true, or false and what fails.
local function fits(labels, by_key)
    for key, reqs in pairs(by_key) do
        local l = labels[key]
        if l and not satisfiable(l, reqs) then
            local shown = {}
            for i, r in ipairs(reqs) do
                shown[i] = r.shown
            end
            return false, table.concat(shown, " with ")
        end
    end
    return true
end

-- An empty term (no expression, no field) matches no node in Kubernetes.
local function empty_term(term)
    return type(term) ~= "table" or (#list_of(term.matchExpressions) == 0 and #list_of(term.matchFields) == 0)
end

--[[
Whether pool's nodes can satisfy spec's nodeSelector and required node affinity on the keys
gpuguard knows: true, or false and what fails ("nodeSelector nvidia.com/gpu.product=NVIDIA-L4";
for affinity, what fails in the first term).
]]
local function selectors_fit(spec, labels, known)
    local terms = fleet.required_terms(spec)
    if #terms == 0 then
        return fits(labels, requirements(spec, nil, known))
    end
    local first
    for _, term in ipairs(terms) do
        if empty_term(term) then
            first = first or "an empty required node affinity term, which matches no node"
        else
            local ok, what = fits(labels, requirements(spec, term, known))
            if ok then
                return true
            end
            first = first or what
        end
    end
    return false, first
end

--[[
The choice a pod makes, or nil when it makes none: { models = {[canonical name] = true} for
gpuguard.io/gpu-model or nil, spec = the pod's own selectors (without the entries gpuguard wrote),
says = "nodeSelector gpuguard.io/pool=l4-infer" (what the pod says, for messages) }.  false and
a message when the annotation names no model.
]]
function M.of(pod, spec, cfg)
    local known = labels_of(cfg).known
    local own = users_spec(spec, own_entries_of(pod, spec, cfg))
    local says = {}
    for k, v in pairs(list_of(own.nodeSelector)) do
        if known[k] then
            says[#says + 1] = string.format("nodeSelector %s=%s", k, tostring(v))
        end
    end
    table.sort(says)
    for _, term in ipairs(fleet.required_terms(own)) do
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
                M.MODEL_ANNOTATION, tostring(name):sub(1, 100), table.concat(have, ", "))
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
    local text = table.concat(says, ", ")
    if #text > SAYS_MAX then
        text = text:sub(1, SAYS_MAX) .. "…"
    end
    return { models = models, spec = own, says = text }
end

-- Does pool satisfy choice for the selectors of spec?  true, or false and what fails.
local function allows_spec(choice, spec, cfg, pool)
    if choice.models then
        local model = fleet.model(cfg, pool)
        if not (model and choice.models[model.name]) then
            return false, string.format("annotation %s", M.MODEL_ANNOTATION)
        end
    end
    local l = labels_of(cfg)
    return selectors_fit(spec, l.by_pool[pool] or NONE, l.known)
end

--- Does pool satisfy choice (from M.of)?  true, or false and what fails.
function M.allows(choice, cfg, pool)
    return allows_spec(choice, choice.spec, cfg, pool)
end

--- Remove from spec's nodeSelector the entries an earlier decision of gpuguard wrote (listed in
--- gpuguard.io/node-selector, still with that value, and one gpuguard writes): they are no
--- choice of the pod's, and the decision about to be made writes its own.
function M.forget_own(pod, spec, cfg)
    for k in pairs(own_entries_of(pod, spec, cfg)) do
        k8s.remove_node_selector(spec, k)
    end
end

--- Take the keys of keys (a map) out of gpuguard.io/node-selector: entries written as a choice
--- (right-sizing's pin of a pool), which a later decision must keep.
function M.disown(pod, keys)
    local listed_text = k8s.annotation(pod, M.OWN_SELECTOR)
    if type(listed_text) ~= "string" then
        return
    end
    local keep = {}
    for k, v in listed_text:gmatch("([^,=]+)=([^,]*)") do
        if keys[k] == nil then
            keep[#keep + 1] = k .. "=" .. v
        end
    end
    if #keep > 0 then
        k8s.set_annotation(pod, M.OWN_SELECTOR, table.concat(keep, ","))
    else
        k8s.remove_annotation(pod, M.OWN_SELECTOR)
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
    return type(v) == "string" and l ~= nil and l[key] ~= nil and satisfiable(l[key], { { op = "In", vals = { v } } })
end

--- The names of the fleet's pools that satisfy choice, as "a, b"; nil when none does.
function M.pools_that_would(choice, cfg)
    local out = {}
    for _, p in ipairs(fleet.pools(cfg)) do
        if M.allows(choice, cfg, p) then
            out[#out + 1] = p.name
        end
    end
    return #out > 0 and table.concat(out, ", ") or nil
end

--[[
The candidates (fleet.candidates' entries) the pod's own choice allows, in order: all of them when
it makes none.  nil and a message when it makes one none of them satisfies, naming the pools that
would and the classes pods of namespace may use that run on them; or when its gpu-model
annotation names no model.
]]
function M.pick(pod, spec, cfg, candidates, class, namespace)
    local choice, msg = M.of(pod, spec, cfg)
    if choice == false then
        return nil, msg
    elseif not choice then
        return candidates
    end
    local out, names = { named = candidates.named }, {}
    for _, c in ipairs(candidates) do
        if M.allows(choice, cfg, c.pool) then
            out[#out + 1] = c
        end
        names[#names + 1] = c.pool.name
    end
    if #out > 0 then
        return out
    end
    local others = M.pools_that_would(choice, cfg)
    local classes = others and fleet.classes_for(cfg, namespace, function(e) return M.allows(choice, cfg, e.pool) end)
    return nil, string.format("the pod asks for %s, which no pool of class %s (%s) has; %s", choice.says, class,
        table.concat(names, ", "), not others and "no pool has it; remove it"
            or #classes > 0 and string.format("pools that do: %s; change the request or use a class that runs on them (%s)",
                others, table.concat(classes, ", "))
            or string.format("pools that do: %s, but no class namespace %s may use runs on them; change the request",
                others, namespace or ""))
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
gpuguard knows (gpuguard's own entries included), its tolerations of the pool's taints, and its
gpu-model annotation.  true, or false and a message that says what to change.
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
    end
    local ok, what = allows_spec(choice or NONE, spec, cfg, pool)
    if ok then
        return true
    end
    local others = choice and M.pools_that_would(choice, cfg)
    return false, string.format("no node of pool %s, where gpuguard placed the pod, has its %s; %s",
        pool.name, what, others and "pools that do: " .. others .. "; change it or ask for one of them"
            or "no pool has it; remove it")
end

return M
