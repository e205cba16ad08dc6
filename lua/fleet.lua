--[[
fleet.lua - the GPU fleet as the configuration describes it: node pools, workload classes and
the sharing mode a class gets; plus the check that refuses a wrong configuration at load time
with the key path of the mistake.

Configuration keys (see deploy/gpuguard.yaml for a complete example):

  pools:                         # GPU node pools, in order of preference
    - name: a100-mig             # DNS label, unique
      model: A100-80GB           # a gpu.lua model name or alias (or one from gpu_models)
      sharing: mig               # exclusive | mig | mps | time-slicing | hami | kai; or dra,
                                 #   volcano: only pods already written for them
      mig_strategy: mixed        # mig only: mixed (default) | single
      replicas: 4                # mps / time-slicing: replicas per GPU (default 1)
      shared_resource: nvidia.com/gpu.shared   # mps / time-slicing (default nvidia.com/gpu)
      mps_env: true              # mps only: set CUDA_MPS_* from the fraction and memory (then a
                                 #   replica is charged its share, else at least its slot, 1/R)
      scheduler_name: kai-scheduler  # pods written for this scheduler (KAI annotations, HAMi or
                                 #   Volcano vGPU resources) run here (kai, hami: their default)
      device_classes: [gpu.nvidia.com]  # DRA pods whose claims use these classes run here
      node_selector: {gpuguard.io/pool: a100-mig}
      taints: [{key: nvidia.com/gpu, value: a100-mig, effect: NoSchedule}]
      cost: 1                    # what a GPU costs against the others (rightsizing; default 1)
  classes:                       # workload class -> sharing modes it may use, preferred first
    inference: {sharing: [mig, time-slicing, exclusive]}   # whole GPUs: exclusive (see choose)
    interactive: {sharing: [time-slicing], max_runtime: 8h, namespaces: [notebooks, team-*]}
    training: {sharing: [exclusive], pools: [h100-train]}   # its pools, preferred first
  default_class: batch
  exclusive: {fractions: round-up}   # round-up (with a warning) | deny

State: what it derives from a configuration (its GPU catalog, the models its pools name, the
taints and node selectors of all pools) is built the first time it is asked for and kept per
configuration table, weak-keyed.  Safe because a loaded configuration never changes: a reload
brings a new table (and a new VM).  What it keeps is shared by every request the VM serves, so
it is handed out read-only (gpuguard.readonly), as the configuration is: a policy that wrote
into a model or a pool would change what every later request reads.
Must not: write into the configuration (it is a read-only table); hand out a table it keeps
other than read-only.
]]

local gg = require "gpuguard"
local gpu = require "gpu"
local args = require "args"


local M = {}

M.MODES = { "exclusive", "mig", "mps", "time-slicing", "hami", "kai" }
-- Pools that only run pods already written for them (DRA claims, Volcano vGPU): no class picks
-- them, a pod's own dialect does (intent.lua).
M.PASS_THROUGH = { dra = true, volcano = true }

-- Does the list hold v?
local function holds(list, v)
    for _, x in ipairs(list) do
        if x == v then
            return true
        end
    end
    return false
end

local function is_mode(s)
    return holds(M.MODES, s)
end

local fail = args.config_fail

local function is_dns_label(s)
    return type(s) == "string" and #s <= 63 and s:match("^[a-z0-9][-a-z0-9]*$") ~= nil and s:sub(-1) ~= "-"
end

local function check_string_map(v, where)
    if v == nil then
        return
    end
    if type(v) ~= "table" or gg.is_array(v) then
        fail(where, "must be a mapping of strings")
    end
    for k, x in pairs(v) do
        if type(x) ~= "string" then
            fail(where .. "." .. k, "must be a string")
        end
    end
end

local function check_taints(taints, where)
    if taints == nil then
        return
    end
    if type(taints) ~= "table" or not gg.is_array(taints) then
        fail(where, "must be a list of taints")
    end
    for i, t in ipairs(taints) do
        local at = string.format("%s[%d]", where, i)
        if type(t) ~= "table" or type(t.key) ~= "string" then
            fail(at .. ".key", "must be a string")
        end
        if t.effect ~= nil and t.effect ~= "NoSchedule" and t.effect ~= "PreferNoSchedule" and t.effect ~= "NoExecute" then
            fail(at .. ".effect", "must be NoSchedule, PreferNoSchedule or NoExecute")
        end
    end
end

local function check_pool(p, i, catalog, seen)
    local at = string.format("pools[%d]", i)
    if type(p) ~= "table" or gg.is_array(p) then
        fail(at, "must be a mapping")
    end
    if not is_dns_label(p.name) then
        fail(at .. ".name", "must be a DNS label (lowercase letters, digits, '-')")
    end
    if seen[p.name] then
        fail(at .. ".name", "%s is also the name of pools[%d]", p.name, seen[p.name])
    end
    seen[p.name] = i
    local model, msg = gpu.model(p.model, catalog)
    if not model then
        fail(at .. ".model", "%s", msg)
    end
    if not is_mode(p.sharing) and not M.PASS_THROUGH[p.sharing] then
        fail(at .. ".sharing", "must be one of %s, dra, volcano", table.concat(M.MODES, ", "))
    end
    if p.sharing == "dra" and p.device_classes == nil then
        fail(at .. ".device_classes", "a dra pool must list the DRA device classes it runs")
    end
    if p.sharing == "mig" then
        if not model.mig then
            fail(at .. ".model", "%s has no MIG profiles, so sharing cannot be mig", model.name)
        end
        if p.mig_strategy ~= nil and p.mig_strategy ~= "mixed" and p.mig_strategy ~= "single" then
            fail(at .. ".mig_strategy", "must be mixed or single")
        end
        if p.mig_strategy == "single" and type(p.mig_profile) ~= "string" then
            fail(at .. ".mig_profile", "the single strategy needs the profile every GPU of the pool is split into")
        end
        if p.mig_profile ~= nil and not gpu.profile(model, p.mig_profile) then
            fail(at .. ".mig_profile", "%s has no profile %s", model.name, tostring(p.mig_profile))
        end
    end
    if p.replicas ~= nil and (math.type(p.replicas) ~= "integer" or p.replicas < 1) then
        fail(at .. ".replicas", "must be a whole number of at least 1")
    end
    if p.shared_resource ~= nil and type(p.shared_resource) ~= "string" then
        fail(at .. ".shared_resource", "must be a resource name such as nvidia.com/gpu.shared")
    end
    if p.scheduler_name ~= nil and not is_dns_label(p.scheduler_name) then
        fail(at .. ".scheduler_name", "must be a scheduler name such as kai-scheduler")
    end
    if p.device_classes ~= nil then
        if type(p.device_classes) ~= "table" or not gg.is_array(p.device_classes) then
            fail(at .. ".device_classes", "must be a list of DRA device class names")
        end
        for j, c in ipairs(p.device_classes) do
            if type(c) ~= "string" or c == "" or #c > 253 then
                fail(at .. ".device_classes[" .. j .. "]", "must be a device class name such as gpu.nvidia.com")
            end
        end
    end
    check_string_map(p.node_selector, at .. ".node_selector")
    check_taints(p.taints, at .. ".taints")
    if p.cost ~= nil and (type(p.cost) ~= "number" or p.cost <= 0) then
        fail(at .. ".cost", "must be a number above 0: what a GPU of this pool costs against the others (default 1)")
    end
    if p.placement ~= nil and p.placement ~= "kueue" then
        fail(at .. ".placement", "must be kueue (Kueue's ResourceFlavors place the pods) or absent")
    end
end

--- Does gpuguard pin pods to the pool's nodes?  Not when Kueue's ResourceFlavors do
--- (placement: kueue): a nodeSelector of ours could conflict with a flavor's nodeLabels.
function M.places(pool)
    return pool.placement ~= "kueue"
end

-- What is worked out from a configuration, once per VM (a catalog: building one walks every
-- model), kept per configuration table, weakly (it goes with the configuration): build(cfg) the
-- first time, as it came when frozen is false (for what never leaves this module), else its
-- read-only view.
local function cached(build, frozen)
    local built = setmetatable({}, { __mode = "k" })
    return function(cfg)
        local v = built[cfg]
        if v == nil then
            v = build(cfg)
            if frozen then
                v = gg.readonly(v)
            end
            built[cfg] = v
        end
        return v
    end
end

--- A function of a configuration that gives build(cfg), built once per configuration table
--- (weakly kept: it goes with the configuration) and shared by every caller, so read-only: a
--- table comes back as a read-only view (gpuguard.readonly; nested tables too), and writing
--- into it raises.  build must not change what it returned afterwards.  A loaded
--- configuration never changes, so what is worked out from it alone holds.
function M.per_config(build)
    return cached(build, true)
end

--- The GPU catalog of cfg (gpu.catalog), built once and shared: read-only.
M.catalog = M.per_config(gpu.catalog)

-- Models by name, per catalog: a lookup normalises the name through several patterns.
local found = setmetatable({}, { __mode = "k" })

--- The model a pool (or a model name) names, from the configuration's catalog: the catalog's
--- own table, read-only (gpu.model(name) gives a copy of one of your own).
function M.model(cfg, pool_or_name)
    local name = type(pool_or_name) == "table" and pool_or_name.model or pool_or_name
    local catalog = M.catalog(cfg)
    local models = found[catalog]
    if not models then
        models = {}
        found[catalog] = models
    end
    local m = models[name]
    if m == nil and type(name) == "string" and name ~= "" then
        m = gpu.model(name, catalog) -- raises nothing for a non-empty string
        models[name] = m
    end
    if m then
        return m
    end
    -- An unknown or bad name: the message, or the error blaming the caller (a tail call).
    return gpu.model(name, catalog)
end

-- classes.<name>.pools: names of pools of the fleet, each running a mode the class lists.
local function check_class_pools(c, at, cfg)
    if c.pools == nil then
        return
    end
    if type(c.pools) ~= "table" or not gg.is_array(c.pools) or #c.pools == 0 then
        fail(at .. ".pools", "must list pool names, preferred first")
    end
    for j, name in ipairs(c.pools) do
        local where = string.format("%s.pools[%d]", at, j)
        local p = M.pool(cfg, name)
        if not p then
            fail(where, "%s is not one of the pools", tostring(name))
        end
        if not holds(c.sharing, p.sharing) then
            fail(where, "pool %s runs %s, which the class does not list in sharing (%s)", name, p.sharing,
                table.concat(c.sharing, ", "))
        end
    end
end

--- Check the fleet part of the configuration; raises error(msg, 0) with the key path.
function M.check(cfg)
    local catalog = gpu.catalog(cfg)
    local pools = cfg.pools
    if pools == nil then
        return
    end
    if type(pools) ~= "table" or not gg.is_array(pools) then
        fail("pools", "must be a list of pools")
    end
    local seen = {}
    for i, p in ipairs(pools) do
        check_pool(p, i, catalog, seen)
    end
    if cfg.classes ~= nil then
        if type(cfg.classes) ~= "table" or gg.is_array(cfg.classes) then
            fail("classes", "must map class names to their settings")
        end
        for name, c in pairs(cfg.classes) do
            local at = "classes." .. name
            if type(c) ~= "table" or type(c.sharing) ~= "table" or #c.sharing == 0 then
                fail(at .. ".sharing", "must list the sharing modes of the class")
            end
            for j, m in ipairs(c.sharing) do
                if not is_mode(m) then
                    fail(at .. ".sharing[" .. j .. "]", "must be one of %s", table.concat(M.MODES, ", "))
                end
            end
            check_class_pools(c, at, cfg)
            if c.max_runtime ~= nil and M.seconds(c.max_runtime) == nil then
                fail(at .. ".max_runtime", "must be a duration such as 8h or 30m")
            end
            if c.namespaces ~= nil then
                if type(c.namespaces) ~= "table" or not gg.is_array(c.namespaces) then
                    fail(at .. ".namespaces", "must be a list of namespaces (a trailing * matches a prefix)")
                end
                for j, ns in ipairs(c.namespaces) do
                    if type(ns) ~= "string" or ns == "" then
                        fail(at .. ".namespaces[" .. j .. "]", "must be a namespace name or a prefix ending in *")
                    end
                end
            end
        end
    end
    if cfg.default_class ~= nil and (cfg.classes == nil or cfg.classes[cfg.default_class] == nil) then
        fail("default_class", "%s is not one of the classes", tostring(cfg.default_class))
    end
end

-- Seconds per unit of a duration.
local UNIT = { w = 604800, d = 86400, h = 3600, m = 60, s = 1 }

--- Seconds of a duration written like "8h", "30m", "90s", "1h30m", "2d", "1w"; nil when
--- malformed.
function M.seconds(s)
    if type(s) ~= "string" or s == "" then
        return nil
    end
    local total, rest = 0, s
    while rest ~= "" do
        local n, unit, tail = rest:match("^(%d+)([wdhms])(.*)$")
        if not n then
            return nil
        end
        total = total + tonumber(n) * UNIT[unit]
        rest = tail
    end
    return total
end

--- The pools of the configuration (a list; empty without any).
function M.pools(cfg)
    return cfg.pools or {}
end

--- The first pool for which matches(pool, arg) is true, or nil.
function M.find_pool(cfg, matches, arg)
    for _, p in ipairs(M.pools(cfg)) do
        if matches(p, arg) then
            return p
        end
    end
    return nil
end

-- Pools by name, per configuration: policies ask for a pool by name on every review.  Kept
-- as built: only the configuration's own pools leave this module.
local pools_by_name = cached(function(cfg)
    local pools = {}
    for _, p in ipairs(M.pools(cfg)) do
        if p.name ~= nil and pools[p.name] == nil then
            pools[p.name] = p
        end
    end
    return pools
end, false)

--- The pool named name (the first, if several are), or nil.
function M.pool(cfg, name)
    return name ~= nil and pools_by_name(cfg)[name] or nil
end

-- class_modes without the copy: the configuration's own list, for callers that only read it.
local function modes_of(cfg, class)
    local c = cfg.classes and (cfg.classes[class] or cfg.classes[cfg.default_class])
    if c then
        return c.sharing
    end
    return M.MODES
end

--- The sharing modes a class may use, preferred first: an unknown class gets the default
--- class's modes, and every mode only when the configuration has no classes.  A fresh list.
function M.class_modes(cfg, class)
    local modes = modes_of(cfg, class)
    local out = {}
    for i, m in ipairs(modes) do
        out[i] = m
    end
    return out
end

local function first_of_mode(pools, mode)
    for _, p in ipairs(pools) do
        if p.sharing == mode then
            return p
        end
    end
    return nil
end

--- The first pool of the given sharing mode, or nil.
function M.pool_for_mode(cfg, mode)
    return first_of_mode(M.pools(cfg), mode)
end

-- The pools a class may use, preferred first: its pools list when it has one (checked), else
-- every pool of the fleet; and whether the class named them.  Kept as built: preference
-- copies the lists.
local class_pools = cached(function(cfg)
    local out = {}
    for name, c in pairs(cfg.classes or {}) do
        if c.pools then
            local list = {}
            for i, p in ipairs(c.pools) do
                list[i] = M.pool(cfg, p)
            end
            out[name] = list
        end
    end
    return out
end, false)

local function pools_of(cfg, class)
    local named = class_pools(cfg)
    local list = named[class] or (cfg.classes and cfg.classes[class] == nil and named[cfg.default_class])
    if list then
        return list, true
    end
    return M.pools(cfg), false
end

-- The pools a class may use in order of preference, each with its mode: its own pools when it
-- names them, else the fleet's pools of its first mode, then of its second, and so on.
local function preference(modes, pools, named)
    local out = {}
    if named then
        for i, p in ipairs(pools) do
            out[i] = { pool = p, mode = p.sharing } -- checked: a mode of the class
        end
        return out
    end
    for _, m in ipairs(modes) do
        for _, p in ipairs(pools) do
            if p.sharing == m then
                out[#out + 1] = { pool = p, mode = m }
            end
        end
    end
    return out
end

-- The entries of list whose mode is mode, in order.
local function of_mode(list, mode)
    local out = {}
    for _, c in ipairs(list) do
        if c.mode == mode then
            out[#out + 1] = c
        end
    end
    return out
end

-- Does namespace match an entry of classes.<name>.namespaces (a name, or a prefix ending in *)?
local function namespace_in(list, namespace)
    for _, pattern in ipairs(list) do
        if pattern == namespace or
            (pattern:sub(-1) == "*" and namespace:sub(1, #pattern - 1) == pattern:sub(1, -2)) then
            return true
        end
    end
    return false
end

--- May pods of namespace use class (a class of the configuration)?  Those without
--- classes.<name>.namespaces, and those that list the namespace.
function M.class_for(cfg, class, namespace)
    local c = cfg.classes and cfg.classes[class]
    return c ~= nil and (c.namespaces == nil or namespace_in(c.namespaces, namespace or ""))
end

--- The classes pods of namespace may use whose pools include one accept({pool, mode}) takes,
--- sorted (every class they may use when accept is nil); {} when the configuration has none.
function M.classes_for(cfg, namespace, accept)
    local out = {}
    for name in pairs(cfg.classes or {}) do
        if M.class_for(cfg, name, namespace) then
            local pools, named = pools_of(cfg, name)
            local fits = accept == nil
            for _, e in ipairs(fits and {} or preference(modes_of(cfg, name), pools, named)) do
                fits = fits or accept(e)
            end
            if fits then
                out[#out + 1] = name
            end
        end
    end
    table.sort(out)
    return out
end

--[[
The pools a pod of class may go to, in the order they are tried: { {pool, mode, sized}, ... }.
With a sharing mode asked for (gpuguard.io/sharing), the class's pools of that mode.  For a
request of whole GPUs only (whole is true), the class's exclusive pools first, since no share
holds several GPUs and one GPU is better given whole (sized: the size of the request put the pool
ahead of the one the class prefers), then the others.  Otherwise the class's pools in order of
preference: its own list when it names its pools (classes.<name>.pools), else the fleet's pools
of its first mode, then of the next.  The caller takes the first one that the pod's own choice
allows and, when the class names its pools (the list's field named is true), that can hold the
request; a class without pools gets the first one the choice allows, as it always has.  nil and
a message that says what to change when the class has none.
]]
function M.candidates(cfg, class, asked, whole)
    local modes = modes_of(cfg, class)
    local pools, named = pools_of(cfg, class)
    local order = preference(modes, pools, named)
    order.named = named
    if asked ~= nil then
        if not holds(modes, asked) then
            return nil, string.format("class %s may use %s, not %s; remove gpuguard.io/sharing or ask for one of those",
                class, table.concat(modes, ", "), asked)
        end
        local list = of_mode(order, asked)
        if #list == 0 then
            -- Suggest only what the class may use and the fleet has.
            local offered = {}
            for _, m in ipairs(modes) do
                if #of_mode(order, m) > 0 then
                    offered[#offered + 1] = m
                end
            end
            if #offered == 0 then
                return nil, string.format("no GPU pool offers %s, nor any mode of class %s (%s)", asked, class,
                    table.concat(modes, ", "))
            end
            return nil, string.format("no GPU pool offers %s; remove gpuguard.io/sharing or ask for %s", asked,
                table.concat(offered, " or "))
        end
        list.named = named
        return list
    end
    if #order == 0 then
        return nil, string.format("no GPU pool offers the sharing modes of class %s (%s)", class,
            table.concat(modes, ", "))
    end
    if not whole or not holds(modes, "exclusive") then
        return order
    end
    local list = of_mode(order, "exclusive")
    list.named = named
    for _, c in ipairs(list) do
        c.sized = c ~= order[1]
    end
    for _, c in ipairs(order) do
        if c.mode ~= "exclusive" then
            list[#list + 1] = c
        end
    end
    return list
end

--- Every taint of every pool, and every node selector entry of every pool (placement checks,
--- on every review): built once per configuration and shared, so read-only.
M.gpu_taints = M.per_config(function(cfg)
    local out = {}
    for _, p in ipairs(M.pools(cfg)) do
        for _, t in ipairs(p.taints or {}) do
            out[#out + 1] = { pool = p.name, taint = t }
        end
    end
    return out
end)

M.gpu_selectors = M.per_config(function(cfg)
    local out = {}
    for _, p in ipairs(M.pools(cfg)) do
        for k, v in pairs(p.node_selector or {}) do
            out[#out + 1] = { pool = p.name, key = k, value = v }
        end
    end
    return out
end)

-- Does toleration tol tolerate taint?  (The scheduler's rule.)
function M.tolerates(tol, taint)
    if tol.effect ~= nil and tol.effect ~= "" and tol.effect ~= taint.effect then
        return false
    end
    if tol.key == nil or tol.key == "" then
        return tol.operator == "Exists"
    end
    if tol.key ~= taint.key then
        return false
    end
    if tol.operator == "Exists" then
        return true
    end
    return (tol.value or "") == (taint.value or "")
end

-- Does a node selector requirement (a matchExpressions entry) pick the nodes of selector s?
local function picks(expr, s)
    if type(expr) ~= "table" or expr.key ~= s.key then
        return false
    end
    if expr.operator == "Exists" then
        return true
    end
    if expr.operator ~= "In" or type(expr.values) ~= "table" then
        return false
    end
    for _, v in ipairs(expr.values) do
        if v == s.value then
            return true
        end
    end
    return false
end

-- An empty list handed out for every spec without terms: read-only, as it is shared.
local NONE = gg.readonly({})

--- The terms of spec's required node affinity (a list, maybe empty): the spec's own, or a
--- shared read-only empty list.
function M.required_terms(spec)
    local na = type(spec.affinity) == "table" and spec.affinity.nodeAffinity
    local req = type(na) == "table" and na.requiredDuringSchedulingIgnoredDuringExecution
    local terms = type(req) == "table" and req.nodeSelectorTerms
    return type(terms) == "table" and terms or NONE
end

-- Is key one of the labels NVIDIA's GPU Feature Discovery and GPU Operator put on GPU nodes
-- (nvidia.com/gpu.present, .product, .deploy.*, nvidia.com/mig.capable, nvidia.com/mig-<p>.count)?
local function gfd_key(key)
    local head = type(key) == "string" and key:sub(1, 15)
    return head == "nvidia.com/gpu." or head == "nvidia.com/mig." or head == "nvidia.com/mig-"
end

-- Requirements that select nodes by a label's presence or value, not its absence.
local SELECTS = { In = true, Exists = true, Gt = true, Lt = true }

-- Append to out the nodeSelector entries (ns) and required node affinity terms of spec that pick
-- nodes by a GPU node label (pool nil): a GPU pool's nodes, whatever the configuration names.
local function gfd_ties(spec, ns, out)
    for k, v in pairs(ns) do
        if gfd_key(k) then
            out[#out + 1] = { what = "nodeSelector", key = k, value = tostring(v) }
        end
    end
    for _, term in ipairs(M.required_terms(spec)) do
        for _, e in ipairs(type(term) == "table" and type(term.matchExpressions) == "table" and term.matchExpressions or NONE) do
            if type(e) == "table" and gfd_key(e.key) and SELECTS[e.operator] then
                local v = type(e.values) == "table" and e.values[1]
                out[#out + 1] = { what = "nodeAffinity", key = e.key, value = v and tostring(v) or e.operator }
                break
            end
        end
    end
end

--[[
What ties a PodSpec to GPU nodes: a list of { what = "toleration" | "nodeSelector" |
"nodeAffinity", key, value, pool }, in that order: a toleration of a pool's taint (key and value
of the taint), a nodeSelector entry of a pool's node_selector, a term of the required node
affinity with an In (holding the pool's value) or Exists requirement on a pool's node_selector
key; then, with pool nil, a nodeSelector entry or required affinity term on a GPU node label of
GFD or the GPU Operator (nvidia.com/gpu.*, nvidia.com/mig.*, nvidia.com/mig-*: In, Exists, Gt,
Lt).  Empty when nothing does.
]]
function M.gpu_ties(spec, cfg)
    local out = {}
    local tolerations = type(spec.tolerations) == "table" and spec.tolerations or NONE
    for _, t in ipairs(M.gpu_taints(cfg)) do
        for _, tol in ipairs(tolerations) do
            if type(tol) == "table" and M.tolerates(tol, t.taint) then
                out[#out + 1] = { what = "toleration", key = t.taint.key, value = t.taint.value,
                    pool = t.pool }
                break
            end
        end
    end
    local selectors = M.gpu_selectors(cfg)
    local ns = type(spec.nodeSelector) == "table" and spec.nodeSelector or NONE
    for _, s in ipairs(selectors) do
        if ns[s.key] == s.value then
            out[#out + 1] = { what = "nodeSelector", key = s.key, value = s.value, pool = s.pool }
        end
    end
    for _, term in ipairs(M.required_terms(spec)) do
        local exprs = type(term) == "table" and term.matchExpressions or NONE
        for _, s in ipairs(selectors) do
            for _, e in ipairs(type(exprs) == "table" and exprs or NONE) do
                if picks(e, s) then
                    out[#out + 1] = { what = "nodeAffinity", key = s.key, value = s.value,
                        pool = s.pool }
                    break
                end
            end
        end
    end
    gfd_ties(spec, ns, out)
    return out
end

return M
