--[[
intent.lua - what GPU a pod asks for, in every dialect gpuguard knows, and what it is charged.

One model for admission (every policy) and for usage (the inventory charges running pods with
intent.usage_charge, the same function): a pod's dialects, the pool that serves it, and its
charge in integer milli-GPU (1000 = one GPU).

  dialect        recognised by                                   charge
  device-plugin  nvidia.com/gpu: N                               N (a replica on a time-sliced
                                                                 pool that keeps the name)
  mig            nvidia.com/mig-<p>                              N x the profile's slice share
  shared         nvidia.com/gpu.shared, nvidia.com/mig-<p>.shared N replicas of the pool (R)
  dra            spec.resourceClaims[].resourceClaimTemplateName per request count x unit(class)
                 spec.resourceClaims[].resourceClaimName         0 (the claim is charged)
  kai            annotations gpu-fraction, gpu-memory,           k x f, k x MiB / GPU memory
                 gpu-fraction-num-devices
  hami           nvidia.com/gpu with nvidia.com/gpumem,          N x max(memory, cores/100)
                 gpumem-percentage, gpucores
  volcano        volcano.sh/vgpu-number, vgpu-memory, vgpu-cores as hami
  gpuguard       gpuguard.io/gpu-fraction, gpuguard.io/gpu-memory rewritten by 10-gpu-sharing
                                                                 into one of the above
  other vendors  other_gpus.resources (amd.com/gpu, ...)         N, every container (or denied:
                                                                 other_gpus.mode deny)

Containers combine as the scheduler combines them (quota.pod_charge); DRA devices and KAI
fractions belong to the pod and are added to it.

The pool of a pod is the one whose node_selector its spec.nodeSelector holds (immutable once
the pod exists), never an annotation.  A shared replica is the only charge the spec leaves
open: its charge is the pool's N/R when the pool is known, else the whole device; the
gpuguard.io/charge annotation may set it between the replica's slot (1/R: time-slicing and MPS
without limits isolate nothing; 1 milli-GPU on an MPS pool with mps_env, see isolates; on an
unknown pool the fleet's smallest slot) and the whole device.
Everything else is computed from the spec, whatever the annotations say.

DRA objects (ResourceClaimTemplate, ResourceClaim) come from gpuguard.dra(kind, namespace, name)
(the server's cache, the input files and --cluster-state of `gpuguard check`), or from
opts.lookup.

State: the claims and templates a pod names (gpuguard.dra) are remembered for the rest of the
request, in both phases (request_lookup says why that is safe); DeviceClasses and slices are
read as asked.  A pod's charge is remembered across requests under what the charge reads of it
(M.charge).
Must not: keep any other state between calls, or write into the pod or the configuration.
]]

local gg = require "gpuguard"
local k8s = require "k8s"
local gpu = require "gpu"
local quota = require "quota"
local fleet = require "fleet"

local M = {}

-- Keys, in one place for every policy (those the C code reads too come from gpuguard.keys).
M.DECISION = gg.keys.decision
M.POOL = gg.keys.pool
M.CHARGE = gg.keys.charge
M.FRACTION = "gpuguard.io/gpu-fraction"
M.MEMORY = "gpuguard.io/gpu-memory"
M.KAI_FRACTION = "gpu-fraction"
M.KAI_MEMORY = "gpu-memory"
M.KAI_DEVICES = "gpu-fraction-num-devices"
M.POD_CLAIM_NAME = "resource.kubernetes.io/pod-claim-name"
M.EXTENDED_RESOURCE_CLAIM = "resource.kubernetes.io/extended-resource-claim"

-- The scheduler each backend dialect needs, unless its pool names another.
M.SCHEDULERS = { kai = "kai-scheduler", hami = "hami-scheduler", volcano = "volcano" }

-- GPU-equivalents per device of the NVIDIA DRA driver's classes (mig.nvidia.com: see mig_unit).
local DRA_CLASSES = {
    ["gpu.nvidia.com"] = 1000,
    ["vfio.gpu.nvidia.com"] = 1000,
    ["compute-domain-daemon.nvidia.com"] = 0,
    ["compute-domain-default-channel.nvidia.com"] = 0,
}
local MIG_CLASS = "mig.nvidia.com"
-- The DRA drivers whose devices are GPUs (dra.gpu_drivers adds more): a DeviceClass of the
-- cluster whose selectors name one is a GPU class, each of its devices a whole GPU.  Not
-- compute-domain.nvidia.com: its IMEX channels are no GPUs.
local GPU_DRIVERS = { "gpu.nvidia.com", "gpu.amd.com", "gpu.intel.com" }
local MAX_CLASS_SELECTORS = 32 -- as the API caps a DeviceClass's selectors

local HAMI = { ["nvidia.com/gpumem"] = true, ["nvidia.com/gpumem-percentage"] = true,
               ["nvidia.com/gpucores"] = true }

local null = gg.null
local NONE = {}
local INIT_AND_REGULAR = { init = true, regular = true } -- k8s.containers' opts, only read
local AMOUNT = { allow_above_one = true, allow_zero = true }
local MAX_DRA_REQUESTS = 32 -- a claim's requests and a request's alternatives, as the API caps

local function ceil_div(a, b)
    return (a + b - 1) // b
end

local function list(v)
    return type(v) == "table" and v or NONE
end

-- Configuration ------------------------------------------------------------------------------

-- The GPU-equivalents of one device of a configured class (dra.classes), in milli, or nil.
local function configured_unit(cfg, class)
    local classes = cfg.dra and cfg.dra.classes
    local v = classes and classes[class]
    if v == nil then
        return nil
    end
    return (quota.parse_fraction(v, AMOUNT))
end

--- Check the dra: section of the configuration; raises error(msg, 0) with the key path.
---   dra:
---     classes: {example.com-gpu: 1}   # GPU-equivalents per device of other GPU classes
---     allocation_all: deny            # deny (default), or the GPUs to charge such a request
-- GPUs of other vendors by default (other_gpus.resources): gpuguard neither places nor splits
-- them, and charges each device a whole GPU (other_gpus.mode: charge) or denies them (deny).
local DEFAULT_OTHER_GPUS = { "amd.com/gpu", "gpu.intel.com/i915", "gpu.intel.com/xe" }

local function check_other_gpus(o)
    if type(o) ~= "table" or gg.is_array(o) then
        error("other_gpus: must be a mapping (resources, mode)", 0)
    end
    if o.mode ~= nil and o.mode ~= "charge" and o.mode ~= "deny" then
        error("other_gpus.mode: must be charge (a whole GPU per device) or deny", 0)
    end
    if o.resources ~= nil then
        if type(o.resources) ~= "table" or not gg.is_array(o.resources) then
            error("other_gpus.resources: must be a list of resource names such as amd.com/gpu", 0)
        end
        for i, r in ipairs(o.resources) do
            if type(r) ~= "string" or not r:match("^[%w.-]+/[%w._-]+$") or r:sub(1, 11) == "nvidia.com/" then
                error(string.format("other_gpus.resources[%d]: must be another vendor's extended resource name such as amd.com/gpu", i), 0)
            end
        end
    end
end

function M.check(cfg)
    if cfg.other_gpus ~= nil then
        check_other_gpus(cfg.other_gpus)
    end
    local d = cfg.dra
    if d == nil then
        return
    end
    if type(d) ~= "table" or gg.is_array(d) then
        error("dra: must be a mapping", 0)
    end
    if d.gpu_drivers ~= nil and (type(d.gpu_drivers) ~= "table" or not gg.is_array(d.gpu_drivers)) then
        error("dra.gpu_drivers: must be a list of DRA driver names such as gpu.example.com", 0)
    end
    for i, name in ipairs(d.gpu_drivers or NONE) do
        if type(name) ~= "string" or not name:match("^[%l%d][%l%d.-]*%.[%l%d.-]*[%l%d]$") then
            error(string.format("dra.gpu_drivers[%d]: must be a DRA driver name such as gpu.example.com", i), 0)
        end
    end
    for class, v in pairs(d.classes or NONE) do
        local _, msg = quota.parse_fraction(v, AMOUNT)
        if msg then
            error(string.format("dra.classes.%s: %s", class, msg), 0)
        end
    end
    if d.allocation_all ~= nil and d.allocation_all ~= "deny" then
        local _, msg = quota.parse_fraction(d.allocation_all, { allow_above_one = true })
        if msg then
            error("dra.allocation_all: must be deny or a number of GPUs, " .. msg, 0)
        end
    end
end

-- Pools --------------------------------------------------------------------------------------

-- Does the nodeSelector ns (a table) hold all of pool's node_selector (and it has one)?
local function selects(pool, ns)
    local any = false
    for k, v in pairs(pool.node_selector or NONE) do
        local have = ns[k]
        if have == nil or have == null or have ~= v then
            return false
        end
        any = true
    end
    return any
end

-- pool_of for the pod's spec; spec.nodeSelector read once for all pools.
local function spec_pool(spec, cfg)
    local ns = spec.nodeSelector
    return type(ns) == "table" and fleet.find_pool(cfg, selects, ns) or nil
end

--- The pool whose node_selector the pod's spec.nodeSelector holds entirely, or nil.
function M.pool_of(pod, cfg)
    local spec = k8s.pod_spec(pod)
    return spec and spec_pool(spec, cfg)
end

--- The scheduler a pool's own dialect needs: scheduler_name, else its sharing mode's.
function M.pool_scheduler(pool)
    return pool.scheduler_name or M.SCHEDULERS[pool.sharing]
end

-- Does pool run dialect (with these DRA classes)?
local function runs(pool, dialect, classes)
    if dialect == "dra" then
        if pool.device_classes == nil then
            return false
        end
        for _, c in ipairs(classes) do
            if not k8s.contains(pool.device_classes, c) then
                return false
            end
        end
        return true
    end
    return pool.sharing == dialect or M.pool_scheduler(pool) == M.SCHEDULERS[dialect]
end

-- What a pool accepts, for messages: "dra-a100 (DRA classes gpu.nvidia.com, mig.nvidia.com)".
local function accepts(pool)
    local what = {}
    if pool.device_classes then
        what[#what + 1] = "DRA classes " .. table.concat(pool.device_classes, ", ")
    end
    if M.pool_scheduler(pool) then
        what[#what + 1] = "schedulerName " .. M.pool_scheduler(pool)
    end
    if not fleet.PASS_THROUGH[pool.sharing] then
        what[#what + 1] = pool.sharing
    end
    return string.format("%s (%s)", pool.name, table.concat(what, "; "))
end

--- What each dialect is called in messages ("DRA claims").
M.DIALECT_WORDS = { dra = "DRA claims", kai = "KAI annotations", hami = "HAMi resources",
                        volcano = "Volcano vGPU resources" }

--[[
The pool that runs a pod written in a backend's own dialect ("dra", "kai", "hami", "volcano";
classes: the GPU device classes of its DRA claims): the first pool that lists every class in
device_classes, or whose scheduler (or sharing mode) is the dialect's.  Returns the pool, or nil
and a message naming the pools and what each accepts.
]]
function M.serving_pool(cfg, dialect, classes)
    local pools = fleet.pools(cfg)
    local names = {}
    for _, p in ipairs(pools) do
        if runs(p, dialect, classes or NONE) then
            return p
        end
        names[#names + 1] = accepts(p)
    end
    local wanted = dialect == "dra" and #(classes or NONE) > 0
        and "DRA device classes " .. table.concat(classes, ", ") or M.DIALECT_WORDS[dialect]
    return nil, string.format("no GPU pool runs %s; the pools are %s; ask for a GPU in a form one of them "
        .. "accepts", wanted, table.concat(names, ", "))
end

-- The smallest GPU memory (MiB) of the fleet's pools, or nil without pools.
local function smallest_memory(cfg)
    local min
    for _, p in ipairs(fleet.pools(cfg)) do
        local m = fleet.model(cfg, p)
        if m and (not min or m.memory_mib < min) then
            min = m.memory_mib
        end
    end
    return min
end

-- DRA ----------------------------------------------------------------------------------------

-- One top-level term of a CEL expression that pins the MIG profile, as NVIDIA's DRA driver
-- documents it; the quotes may be single or double.
local PROFILE_TERM = "^device%.attributes%[([\"'])gpu%.nvidia%.com%1%]%.profile%s*==%s*([\"'])"
    .. "([%w%.%+%-]+)%2$"

-- The CEL expression of a selector when its literals read here as CEL reads them: a string of
-- at most 10 KiB without escapes, raw, byte or triple-quoted strings (a literal starting with an
-- r, b, rb or br prefix); else nil.  Both readers of selectors take only these.
local function readable_cel(selector)
    local expr = type(selector) == "table" and type(selector.cel) == "table" and selector.cel.expression
    if type(expr) ~= "string" or #expr > 10240 or expr:find("\\", 1, true) or expr:find("'''", 1, true)
        or expr:find('"""', 1, true) then
        return nil
    end
    local at = expr:find("['\"]")
    while at do -- each literal: no prefix, and closed
        local close = expr:find(expr:sub(at, at), at + 1, true)
        if not close or (at > 1 and expr:sub(at - 1, at - 1):match("[rRbB]")) then
            return nil
        end
        at = expr:find("['\"]", close + 1)
    end
    return expr
end

-- The top-level '&&' terms of a readable CEL expression (readable_cel), or nil when it is
-- anything but a conjunction at the top level ('||' or '?' outside brackets and literals,
-- unbalanced brackets), or when it has a comment: CEL ignores '//' to the end of the line, so
-- what follows it (a profile pin, a quote that would hide a '||' line from this reading) is no
-- part of the expression.  A device that satisfies the expression satisfies each term.
local function conjuncts(expr)
    local terms, depth, start, i, n = {}, 0, 1, 1, #expr
    while i <= n do
        local c = expr:byte(i)
        if c == 39 or c == 34 then -- a literal: on to its closing quote
            i = expr:find(c == 39 and "'" or '"', i + 1, true)
            if not i then
                return nil
            end
        elseif c == 47 and expr:byte(i + 1) == 47 then -- a comment
            return nil
        elseif c == 40 or c == 91 or c == 123 then -- ( [ {
            depth = depth + 1
        elseif c == 41 or c == 93 or c == 125 then
            depth = depth - 1
            if depth < 0 then
                return nil
            end
        elseif depth == 0 then
            local two = expr:sub(i, i + 1)
            if two == "||" or c == 63 then -- '?'
                return nil
            elseif two == "&&" then
                terms[#terms + 1] = expr:sub(start, i - 1)
                start = i + 2
                i = i + 1
            end
        end
        i = i + 1
    end
    if depth ~= 0 then
        return nil
    end
    terms[#terms + 1] = expr:sub(start)
    return terms
end

-- The MIG profile a request's CEL selectors pin: a selector that is, or has as a top-level '&&'
-- term, "device.attributes['gpu.nvidia.com'].profile == '1g.10gb'"; nil otherwise (a profile
-- named anywhere else, under '!' or beside '||', pins nothing).
local function selected_profile(sub)
    for _, s in ipairs(list(sub.selectors)) do
        local expr = readable_cel(s)
        local terms = expr and conjuncts(expr)
        for _, term in ipairs(terms or NONE) do
            local _, _, p = term:match("^%s*(.-)%s*$"):match(PROFILE_TERM)
            if p then
                return p
            end
        end
    end
    return nil
end

-- The charge of one device of a MIG profile: on the pool's model when it has that profile,
-- else the largest share among the catalog's models that have it; a whole GPU when none does.
local function mig_unit(cfg, pool, profile)
    if not profile then
        return 1000
    end
    local model = pool and fleet.model(cfg, pool)
    local got = model and (gpu.charge_milli(model, profile))
    if got then
        return got
    end
    local catalog = fleet.catalog(cfg)
    local best
    for _, name in ipairs(catalog.names) do
        local c = gpu.charge_milli(catalog.models[name], profile)
        if c and (not best or c > best) then
            best = c
        end
    end
    return best or 1000
end

-- gpuguard.dra when the host provides it (the engine does), else no DRA objects at all.
local function host_lookup(kind, namespace, name)
    local f = gg.dra
    if f then
        return f(kind, namespace, name) -- the object; or nil, and why when unknown
    end
    return nil
end

-- gpuguard.dra's answers in each request, by the view of its pod (gpuguard.frozen: one key for
-- the whole request, in both phases), then by kind, namespace and name: { object, why }.  A DRA
-- pod's charge is worked out several times a review (the pass-through twice, the quota), and
-- each gpuguard.dra call copies the object out of the inventory and converts it
-- again.  The object is the cluster's, not the pod's, so edits to the pod leave the answer
-- good; the policies of one review see one version of it, and a template the API server had to
-- be asked for is asked for once.  Only this module reads the objects, and never writes them.
local dra_answers = setmetatable({}, { __mode = "k" })

-- host_lookup, remembering its answers for the rest of pod's request.
local function request_lookup(pod)
    local answers = k8s.request_memo(dra_answers, pod)
    return function(kind, namespace, name)
        local k = kind .. "\0" .. namespace .. "\0" .. name
        local a = answers[k]
        if a == nil then
            a = table.pack(host_lookup(kind, namespace, name))
            answers[k] = a
        end
        return a[1], a[2]
    end
end

-- Whether a string literal of a DeviceClass selector names one of the drivers: it is one of
-- them, or part of one (device.driver.endsWith("nvidia.com")), or holds one.
local function names_driver(literal, drivers)
    if #literal < 3 then
        return false
    end
    for _, d in ipairs(drivers) do
        if d:find(literal, 1, true) or literal:find(d, 1, true) then
            return true
        end
    end
    return false
end

-- The GPU drivers: GPU_DRIVERS and dra.gpu_drivers, worked out once per configuration.
local gpu_drivers = fleet.per_config(function(cfg)
    local all = { table.unpack(GPU_DRIVERS) }
    for _, d in ipairs(cfg.dra and cfg.dra.gpu_drivers or NONE) do
        all[#all + 1] = d
    end
    return all
end)

-- Whether a DeviceClass's selectors may pick GPUs: one names a GPU driver in a string literal,
-- or one cannot be read that far (escapes, raw, byte or triple-quoted strings, no expression),
-- or the class has no selector at all (it selects every device).  Comments are read as code: a
-- driver named in one counts, on the safe side.
local function selects_gpus(class_obj, cfg)
    local selectors = type(class_obj.spec) == "table" and class_obj.spec.selectors
    if type(selectors) ~= "table" or #selectors == 0 or #selectors > MAX_CLASS_SELECTORS then
        return true
    end
    local drivers = gpu_drivers(cfg)
    for _, sel in ipairs(selectors) do
        local expr = readable_cel(sel)
        if not expr then
            return true
        end
        for _, literal in expr:gmatch("(['\"])(.-)%1") do
            if names_driver(literal, drivers) then
                return true
            end
        end
    end
    return false
end

-- A DeviceClass of the cluster (gpuguard.dra("DeviceClass", "", name)) that selects GPUs: one
-- whole GPU per device; nil when the class is not known or selects no GPU.
local function cluster_class_unit(cfg, class)
    local obj = host_lookup("DeviceClass", "", class)
    if type(obj) == "table" and selects_gpus(obj, cfg) then
        return 1000
    end
    return nil
end

-- A device's string attribute, named plain or qualified with its driver's domain.
local function device_attribute(attrs, driver, name)
    local a = attrs[name] or attrs[driver .. "/" .. name]
    return type(a) == "table" and type(a.string) == "string" and a.string or nil
end

-- The charge of the devices a claim was allocated (status.allocation.devices.results), as their
-- ResourceSlices describe them (gpuguard.dra("Device", "<driver>/<pool>", device)): a device of
-- a GPU driver is a whole GPU, a MIG device the share of its profile.  Devices of other drivers,
-- adminAccess results and devices no slice shows count nothing here: the claim's spec is
-- charged too, and the larger of the two counts.
local function allocated_charge(claim, cfg)
    local status = type(claim.status) == "table" and claim.status
    local alloc = status and type(status.allocation) == "table" and status.allocation
    local devices = alloc and type(alloc.devices) == "table" and alloc.devices
    local total, drivers = 0, gpu_drivers(cfg)
    for _, r in ipairs(devices and list(devices.results) or NONE) do
        local dev = type(r) == "table" and r.adminAccess ~= true and type(r.pool) == "string"
            and type(r.device) == "string" and k8s.contains(drivers, r.driver)
            and host_lookup("Device", r.driver .. "/" .. r.pool, r.device)
        local attrs = type(dev) == "table" and type(dev.attributes) == "table" and dev.attributes
        if attrs then
            local profile = device_attribute(attrs, r.driver, "type") == "mig"
                and device_attribute(attrs, r.driver, "profile")
            total = total + mig_unit(cfg, nil, profile or nil)
        end
    end
    return total
end

--- GPU-equivalents (milli) of one device of a DRA device class; nil for a class that is not a
--- GPU (not gpuguard's business): NVIDIA's classes, then dra.classes, then the cluster's own
--- DeviceClass by its selectors.
function M.class_unit(cfg, class, sub, pool)
    local unit = DRA_CLASSES[class]
    if unit then
        return unit
    elseif class == MIG_CLASS then
        return mig_unit(cfg, pool, sub and selected_profile(sub))
    end
    return configured_unit(cfg, class) or cluster_class_unit(cfg, class)
end

-- A request's alternatives: v1/v1beta2 exactly or firstAvailable, v1beta1 flat fields.
local function alternatives(r)
    if type(r.exactly) == "table" then
        return { r.exactly }, r.exactly.adminAccess == true
    elseif type(r.firstAvailable) == "table" then
        return r.firstAvailable, false
    elseif r.deviceClassName ~= nil or r.firstAvailable ~= nil then
        return { r }, r.adminAccess == true
    end
    return nil
end

-- The charge of one alternative (nil for a non-GPU class), or false and a message.  An
-- adminAccess request (monitoring, such as DCGM's exporter) allocates nothing: every device of
-- its class is fine there, and it is charged 0 by claim_charge.
local function alternative_charge(cfg, sub, pool, where, admin)
    local class = sub.deviceClassName
    if type(class) ~= "string" then
        return false, where .. " names no deviceClassName"
    end
    local unit = M.class_unit(cfg, class, sub, pool)
    if unit == nil or unit == 0 then -- not a GPU (an IMEX channel of a ComputeDomain)
        return nil
    end
    if sub.allocationMode == "All" and not admin then
        local all = cfg.dra and cfg.dra.allocation_all
        if all == nil or all == "deny" then
            return false, string.format("%s asks for every device of class %s (allocationMode: All); ask for "
                .. "a count of devices instead", where, class)
        end
        return (quota.parse_fraction(all, AMOUNT)), class
    end
    local count = sub.count
    if count == nil or sub.allocationMode == "All" then
        count = 1
    end
    if math.type(count) ~= "integer" or count < 1 then
        return false, string.format("%s: count must be a whole number of at least 1", where)
    end
    return count * unit, class
end

--[[
The charge of a DRA claim spec (ResourceClaim.spec, ResourceClaimTemplate.spec.spec) in milli-GPU,
and the GPU device classes it uses (a list); or nil and a message.  Each request: count x unit;
firstAvailable: the largest alternative; adminAccess: 0 (with allocationMode All too);
allocationMode All otherwise: denied unless dra.allocation_all gives a charge.  what names the object in messages.
]]
function M.claim_charge(cfg, claim_spec, what, pool)
    local devices = type(claim_spec) == "table" and claim_spec.devices
    if type(claim_spec) == "table" and claim_spec.resourceClassName ~= nil then
        return nil, what .. " is a resource.k8s.io/v1alpha2 claim (resourceClassName), which no "
            .. "current Kubernetes serves; write it as resource.k8s.io/v1 with spec.devices.requests"
    end
    local total, classes, seen = 0, {}, {}
    local requests = type(devices) == "table" and list(devices.requests) or NONE
    if #requests > MAX_DRA_REQUESTS then
        return nil, string.format("%s has %d requests, more than the %d Kubernetes allows", what, #requests,
            MAX_DRA_REQUESTS)
    end
    for i, r in ipairs(requests) do
        local where = string.format("%s request %s", what,
            type(r) == "table" and type(r.name) == "string" and r.name or "#" .. i)
        local subs, admin = alternatives(type(r) == "table" and r or NONE)
        if not subs or #subs > MAX_DRA_REQUESTS then
            return nil, where .. " has neither exactly nor firstAvailable with a deviceClassName"
        end
        local best = nil
        for _, sub in ipairs(subs) do
            local c, class = alternative_charge(cfg, type(sub) == "table" and sub or NONE, pool, where,
                admin)
            if c == false then
                return nil, class
            end
            if c then
                best = math.max(best or 0, c)
                if not seen[class] then
                    seen[class] = true
                    classes[#classes + 1] = class
                end
            end
        end
        if best and not admin then
            total = total + best
        end
    end
    return total, classes
end

--- The annotation that makes a claim (a ResourceClaim object, or nil) charged to a pod, not on
--- its own: M.POD_CLAIM_NAME (made from the pod's template) or M.EXTENDED_RESOURCE_CLAIM (made by
--- the scheduler for the pod's extended resources); nil for a claim of its own.
function M.claim_charged_elsewhere(claim)
    local meta = type(claim) == "table" and claim.metadata
    local a = type(meta) == "table" and meta.annotations
    if type(a) ~= "table" then
        return nil
    elseif a[M.POD_CLAIM_NAME] ~= nil then
        return M.POD_CLAIM_NAME
    elseif a[M.EXTENDED_RESOURCE_CLAIM] == "true" then
        return M.EXTENDED_RESOURCE_CLAIM
    end
    return nil
end

-- The DRA part of a pod: its charge, items for the breakdown, GPU classes; or nil and a message.
--[[
The ResourceClaim made for the pod's claim named name from its template, as the pod's
status.resourceClaimStatuses names it and lookup finds it, and its name; nil while there is none
(at admission; before the resourceclaim controller made it; not found).
]]
local function generated_claim(pod, name, ns, lookup)
    local status = type(pod.status) == "table" and pod.status.resourceClaimStatuses
    for _, st in ipairs(list(status)) do
        if type(st) == "table" and st.name == name and type(st.resourceClaimName) == "string" then
            local claim = lookup("ResourceClaim", ns, st.resourceClaimName)
            if type(claim) == "table" and type(claim.spec) == "table" then
                return claim, st.resourceClaimName
            end
        end
    end
    return nil
end

local function pod_dra(pod, spec, cfg, pool, lookup, namespace)
    local refs = list(spec.resourceClaims)
    if #refs == 0 then
        return 0, NONE, NONE
    end
    lookup = lookup or request_lookup(pod)
    local meta = k8s.pod_meta(pod)
    local ns = namespace or meta and type(meta.namespace) == "string" and meta.namespace or "default"
    local total, items, classes = 0, {}, {}
    for _, ref in ipairs(refs) do
        if type(ref) == "table" and ref.source ~= nil then
            return nil, string.format("resourceClaims %s uses source, the resource.k8s.io/v1alpha2 form; name "
                .. "resourceClaimTemplateName or resourceClaimName directly", tostring(ref.name))
        end
        local tname = type(ref) == "table" and ref.resourceClaimTemplateName
        local cname = type(ref) == "table" and ref.resourceClaimName
        if type(tname) == "string" then
            -- What the pod holds: the claim made for it from the template once there is one (a
            -- template deleted or made again under its name since changes nothing of it), else
            -- the template.
            local claim_spec, what, rule
            local generated, gname = generated_claim(pod, ref.name, ns, lookup)
            if generated then
                claim_spec, what, rule = generated.spec, "ResourceClaim " .. gname, "DRA claim made for the pod"
            else
                local t, why = lookup("ResourceClaimTemplate", ns, tname)
                if not t and why then
                    return nil, string.format("resourceClaims %s: ResourceClaimTemplate %s/%s could not be read (%s); "
                        .. "try again", tostring(ref.name), ns, tname, why)
                elseif not t then
                    return nil, string.format("resourceClaims %s names ResourceClaimTemplate %s/%s, which does not "
                        .. "exist; create it first", tostring(ref.name), ns, tname)
                end
                claim_spec, what, rule = type(t.spec) == "table" and t.spec.spec, "ResourceClaimTemplate " .. tname,
                    "DRA template"
            end
            local c, got = M.claim_charge(cfg, claim_spec, what, pool)
            if not c then
                return nil, got
            end
            if generated then -- what it was allocated, once it is, if more
                c = math.max(c, allocated_charge(generated, cfg))
            end
            if #got > 0 or c > 0 then
                total = total + c
                items[#items + 1] = { resource = what, count = 1, each = c, charge = c, rule = rule }
                for _, class in ipairs(got) do
                    classes[#classes + 1] = class
                end
            end
        elseif type(cname) == "string" then
            local claim, why = lookup("ResourceClaim", ns, cname)
            local got = NONE
            if not claim and why then
                return nil, string.format("resourceClaims %s: ResourceClaim %s/%s could not be read (%s); "
                    .. "try again", tostring(ref.name), ns, cname, why)
            end
            local made_for = M.claim_charged_elsewhere(claim)
            if made_for then
                -- Charged to the pod it was made for: a second pod on it would hold its devices
                -- uncharged, and keep them once that pod is gone.
                return nil, string.format("resourceClaims %s names ResourceClaim %s/%s, which was made for "
                    .. "another pod's own use (annotation %s); use a ResourceClaimTemplate or a "
                    .. "ResourceClaim of your own", tostring(ref.name), ns, cname, made_for)
            end
            if claim then
                local c, cl = M.claim_charge(cfg, claim.spec, "ResourceClaim " .. cname, pool)
                got = c and cl or NONE
            end
            -- Unknown claims count as GPU claims: whether the pod wants a GPU is never guessed down.
            if not claim or #got > 0 then
                items[#items + 1] = { resource = "ResourceClaim " .. cname, count = 1, each = 0, charge = 0,
                                      rule = "shared claim, charged to the claim" }
                for _, class in ipairs(got) do
                    classes[#classes + 1] = class
                end
                classes.shared_claim = true
            end
        else
            return nil, string.format("resourceClaims %s names neither resourceClaimTemplateName nor "
                .. "resourceClaimName", type(ref) == "table" and tostring(ref.name) or "?")
        end
    end
    return total, items, classes
end

-- KAI ----------------------------------------------------------------------------------------

-- The annotations k8s.annotation(pod, key) reads, or NONE: read once for several keys, as each
-- read of the object in validate is a C call.
local function annotations_of(pod)
    return k8s.annotations(pod) or NONE
end

-- annotations[key] as k8s.annotation gives it: nil for JSON null.
local function annotation_in(annotations, key)
    local v = annotations[key]
    if v == null then
        return nil
    end
    return v
end

-- KAI's annotations as a share and a device count; nil and a message for illegal values.
local function kai_share(pod, spec, memory_mib)
    local annotations = annotations_of(pod)
    local f = annotation_in(annotations, M.KAI_FRACTION)
    local mem = annotation_in(annotations, M.KAI_MEMORY)
    local devices = annotation_in(annotations, M.KAI_DEVICES)
    if not f and not mem then
        if devices then
            return nil, "annotation gpu-fraction-num-devices needs gpu-fraction or gpu-memory beside it"
        end
        return nil
    end
    if f and mem then
        return nil, "annotations gpu-fraction and gpu-memory are exclusive in KAI; keep one of them"
    end
    for c in k8s.containers(spec, INIT_AND_REGULAR) do
        if k8s.get_resource(c, "limits", "nvidia.com/gpu") or k8s.get_resource(c, "requests", "nvidia.com/gpu") then
            return nil, string.format("annotation %s and nvidia.com/gpu (container %s) are exclusive in KAI; "
                .. "remove nvidia.com/gpu or the annotation", f and M.KAI_FRACTION or M.KAI_MEMORY, tostring(c.name))
        end
    end
    local k = 1
    if devices then
        k = type(devices) == "string" and devices:match("^%d+$") and #devices <= 4 and math.tointeger(tonumber(devices))
        if not k or k < 1 then
            return nil, string.format("annotation gpu-fraction-num-devices: %q must be a whole number of at least 1",
                tostring(devices))
        end
    end
    local share
    if f then
        local m, msg = quota.parse_fraction(f, { name = M.KAI_FRACTION, allow_above_one = true })
        if not m then
            return nil, "annotation " .. msg
        end
        if m >= 1000 then
            return nil, string.format("annotation gpu-fraction: %q must be less than 1 in KAI; ask for whole "
                .. "GPUs with nvidia.com/gpu instead", f)
        end
        share = m
    else
        local mib = type(mem) == "string" and mem:match("^%d+$") and #mem <= 9 and math.tointeger(tonumber(mem))
        if not mib or mib < 1 then
            return nil, string.format("annotation gpu-memory: %q must be a whole number of MiB such as 2000",
                tostring(mem))
        end
        share = memory_mib and math.min(1000, ceil_div(mib * 1000, memory_mib)) or 1000
    end
    return share, k
end

-- Dialects -----------------------------------------------------------------------------------

-- gpuguard's per-container annotations begin with these (OWN begins both: one test for most keys).
local OWN, FRACTION_DOT, MEMORY_DOT = "gpuguard.io/gpu-", M.FRACTION .. ".", M.MEMORY .. "."

-- The dialects of the containers' resources (a set).
local function resource_dialects(spec, out)
    for c in k8s.containers(spec, INIT_AND_REGULAR) do
        local ok, items = pcall(gpu.requested, c)
        for _, it in ipairs(ok and items or NONE) do
            if HAMI[it.resource] then
                out.hami = true
            elseif it.kind == "volcano" then
                out.volcano = true
            elseif it.kind == "mig" then
                out.mig = true
            elseif it.kind == "shared" then
                out.shared = true
            elseif it.kind == "whole" then
                out["device-plugin"] = true
            elseif it.kind == "dra" then
                out.dra = true
            end
        end
        if not ok then
            out.malformed = true
        end
    end
end

-- Does the pod ask through gpuguard's own annotations (fraction or memory, of the pod or of one
-- container)?
local function asks_gpuguard(pod)
    local meta = k8s.pod_meta(pod)
    for key in pairs(meta and type(meta.annotations) == "table" and meta.annotations or NONE) do
        if key == M.FRACTION or key == M.MEMORY or (type(key) == "string" and key:sub(1, #OWN) == OWN
            and (key:sub(1, #FRACTION_DOT) == FRACTION_DOT or key:sub(1, #MEMORY_DOT) == MEMORY_DOT)) then
            return true
        end
    end
    return false
end

--- The dialects a pod is written in, as a set: "device-plugin", "mig", "shared", "dra", "kai",
--- "hami", "volcano", "gpuguard" (its own annotations).  Cheap: reads no DRA object.  With
--- own_first, a pod that asks through gpuguard's annotations gets { gpuguard = true } alone,
--- without the walk of its containers: for a caller to whom that request outweighs the others.
function M.dialects(pod, own_first)
    local out = {}
    local spec = k8s.pod_spec(pod)
    if not spec then
        return out
    end
    if asks_gpuguard(pod) then
        out.gpuguard = true
        if own_first then
            return out
        end
    end
    resource_dialects(spec, out)
    if out.hami then
        out["device-plugin"] = nil -- nvidia.com/gpu counts HAMi's physical GPUs
    end
    if #list(spec.resourceClaims) > 0 then
        out.dra = true
    end
    local annotations = annotations_of(pod)
    if annotation_in(annotations, M.KAI_FRACTION) or annotation_in(annotations, M.KAI_MEMORY)
        or annotation_in(annotations, M.KAI_DEVICES) then
        out.kai = true
    end
    return out
end

-- The backend dialects, in the order foreign names them.
local FOREIGN = { "dra", "kai", "hami", "volcano" }

--- The backend dialect a pod is already written in and that gpuguard passes through: "dra",
--- "kai", "hami" or "volcano"; nil for none.  Two at once is an error (nil and a message).
function M.foreign(d)
    local found
    for i = 1, #FOREIGN do
        local name = FOREIGN[i]
        if d[name] then
            if found then
                return nil, string.format("the pod asks for GPUs in two dialects at once (%s and %s); use one", found,
                    name)
            end
            found = name
        end
    end
    return found
end

-- Charges ------------------------------------------------------------------------------------

--- What nvidia.com/gpu stands for on pool (nil: no pool): "mig", a MIG device (single
--- strategy), "replica", a shared replica (time-slicing or MPS keeping the resource's name), or
--- "whole".
function M.gpu_means(pool)
    if pool and pool.sharing == "mig" and pool.mig_strategy == "single" then
        return "mig"
    elseif pool and (pool.sharing == "time-slicing" or pool.sharing == "mps")
        and (pool.shared_resource or "nvidia.com/gpu") == "nvidia.com/gpu" then
        return "replica"
    end
    return "whole"
end

--- Does pool hold each replica to its share?  MPS with mps_env (gpuguard sets the replica's
--- compute and memory limits) does; time-slicing isolates neither memory nor compute, and MPS
--- without those limits lets a replica take the GPU, so a replica there holds one of the R slots
--- of its GPU whatever it asked for, and is charged at least that.
function M.isolates(pool)
    return pool ~= nil and pool.sharing == "mps" and pool.mps_env == true
end

-- The replicas per GPU that bound a replica's charge from below when its pool is not known (a
-- pool Kueue places has no nodeSelector of gpuguard's): the most of any pool whose replicas
-- hold a slot, its slot being the fleet's smallest; nil when some pool holds replicas to their
-- share (its floor is 1 milli-GPU).
local unknown_pool_replicas = fleet.per_config(function(cfg)
    local most = 1
    for _, p in ipairs(fleet.pools(cfg)) do
        if M.isolates(p) then
            return { replicas = nil }
        elseif p.sharing == "time-slicing" or p.sharing == "mps" then
            most = math.max(most, p.replicas or 1)
        end
    end
    return { replicas = most }
end)

-- quota.pod_charge's context for a pod on pool (nil: unknown), replicas charged at R.
local function context(cfg, pool, memory_mib, replicas)
    local mig = pool and pool.sharing == "mig" and pool or fleet.pool_for_mode(cfg, "mig")
    local model = mig and mig.model
    if type(model) == "string" and model ~= "" then
        -- The catalog's table, as pod_charge would look it up, from fleet's memo; an unknown
        -- name stays a name, for pod_charge's message.
        model = fleet.model(cfg, model) or model
    end
    -- requested: the containers' GPU resources, read once for the up to three pod_charge calls.
    local ctx = { model = model, catalog = fleet.catalog(cfg), memory_mib = memory_mib,
                  replicas = replicas, requested = {} }
    local means = M.gpu_means(pool)
    if means == "mig" then
        ctx.gpu_means, ctx.profile = "mig", pool.mig_profile
    elseif means == "replica" then
        ctx.gpu_means = "replica"
    end
    return ctx
end

local function has_replicas(breakdown)
    for _, b in ipairs(breakdown) do
        for _, it in ipairs(b.items) do
            if it.rule:sub(1, 14) == "shared replica" then
                return true
            end
        end
    end
    return false
end

-- classes (pod_dra's) and the device classes of the DRA extended resources in breakdown
-- (quota.pod_charge's lines with a class), each once: a new list when one is added.
local function with_extended_classes(breakdown, classes)
    local out = classes
    for _, b in ipairs(breakdown) do
        for _, it in ipairs(b.items) do
            local class = it.class
            if class and not k8s.contains(out, class) then
                if out == classes then
                    out = { shared_claim = classes.shared_claim }
                    table.move(classes, 1, #classes, 1, out)
                end
                out[#out + 1] = class
            end
        end
    end
    return out
end

-- The resource names other_gpus looks for, as a set, per configuration.
local other_gpu_names = fleet.per_config(function(cfg)
    local set = {}
    for _, r in ipairs((cfg.other_gpus or NONE).resources or DEFAULT_OTHER_GPUS) do
        set[r] = true
    end
    return set
end)

local RESOURCE_SECTIONS = { "requests", "limits" }

-- Does container c name one of the resources in the set wanted, in its requests or limits?
-- Read with gpuguard.fields: one C call a section, where asking for each name in turn
-- (k8s.request_milli) reads three tables per name and section, each a C call in validate.
local function names_any(c, wanted)
    for s = 1, 2 do
        local keys = gg.fields(c, "resources", RESOURCE_SECTIONS[s])
        for i = 1, #keys do
            if wanted[keys[i]] then
                return true
            end
        end
    end
    return false
end

-- The devices of other vendors' GPUs the pod's containers ask for, as breakdown items, and
-- their charge (a whole GPU each, every init and regular container counted: more than the
-- scheduler reserves for init containers, never less; ephemeral containers may not ask for
-- resources, and the charge spec leaves them out); or nil and a message for a request that is
-- not a whole number or, under other_gpus.mode: deny, any request.
local function other_gpus(spec, cfg)
    local o = cfg.other_gpus or NONE
    local items, total = {}, 0
    local wanted = other_gpu_names(cfg)
    for c in k8s.containers(spec, INIT_AND_REGULAR) do
        for _, r in ipairs(names_any(c, wanted) and (o.resources or DEFAULT_OTHER_GPUS) or NONE) do
            local ok, milli = pcall(k8s.request_milli, c, r)
            if not ok or (milli and milli % 1000 ~= 0) then
                return nil, string.format("container %s: %s must be a whole number of devices", tostring(c.name), r)
            elseif milli and milli > 0 then
                if o.mode == "deny" then
                    return nil, string.format("container %s asks for %s, a GPU of another vendor that gpuguard does not run here (other_gpus.mode: deny); ask for nvidia.com/gpu or gpuguard.io/gpu-fraction",
                        tostring(c.name), r)
                end
                items[#items + 1] = { resource = r, count = milli // 1000, each = 1000, charge = milli,
                                      rule = "another vendor's GPU" }
                total = total + milli
            end
        end
    end
    return total, items
end

-- intent.charge, worked out (below, the memo in front of it).
local function charge_of(pod, cfg, opts)
    opts = opts or NONE
    local spec = k8s.pod_spec(pod)
    if not spec then
        return 0, {}, {}
    end
    local pool = opts.pool or spec_pool(spec, cfg)
    local model = pool and fleet.model(cfg, pool)
    local memory_mib = model and model.memory_mib or smallest_memory(cfg)
    local share, k = kai_share(pod, spec, memory_mib)
    if share == nil and k then
        return nil, k
    end
    local dra, dra_items, classes = pod_dra(pod, spec, cfg, pool, opts.lookup, opts.namespace)
    if not dra then
        return nil, dra_items
    end
    local replicas = pool and (pool.replicas or 1) or 1
    local ctx = context(cfg, pool, memory_mib, replicas)
    ctx.fraction_milli, ctx.fraction_devices = share, k
    ctx.replica_milli_in = opts.shares
    local ok, total, breakdown = pcall(quota.pod_charge, spec, ctx)
    if not ok then
        return nil, (tostring(total):gsub("^.-quota%.pod_charge: ", ""))
    elseif not total then
        return nil, breakdown
    end
    if has_replicas(breakdown) and not opts.shares then
        -- Open: the annotation may refine it between the floor per replica (its slot, 1 milli
        -- where the pool holds replicas to their share) and the whole device.
        local note = k8s.annotation(pod, M.CHARGE)
        local milli = type(note) == "string" and #note <= 12 and note:match("^%d+$") and math.tointeger(tonumber(note))
        if milli then
            local slots -- the replicas per GPU whose slot is the floor; nil: 1 milli-GPU
            if pool then
                slots = not M.isolates(pool) and (pool.replicas or 1) or nil
            else
                slots = unknown_pool_replicas(cfg).replicas
            end
            if slots then
                ctx.replicas = slots
            else
                ctx.replicas, ctx.replica_milli = nil, 1
            end
            local floor = quota.pod_charge(spec, ctx)
            ctx.replica_milli, ctx.replicas = nil, 1
            local ceiling = quota.pod_charge(spec, ctx)
            total = math.max(floor, math.min(ceiling, milli))
        elseif not pool then
            ctx.replicas = 1
            total = quota.pod_charge(spec, ctx)
        end
    end
    if dra > 0 or #dra_items > 0 then
        breakdown[#breakdown + 1] = { kind = "pod", charge = dra, items = dra_items }
    end
    local other, other_items = other_gpus(spec, cfg)
    if not other then
        return nil, other_items
    elseif other > 0 then
        breakdown[#breakdown + 1] = { kind = "pod", charge = other, items = other_items }
    end
    return total + dra + other, breakdown, with_extended_classes(breakdown, classes)
end

-- Charges already worked out, by gpuguard.charge_key (the pod's charge spec, what the model
-- reads of it, and the request's namespace; compared in full): most pods are copies, the
-- pods of one ReplicaSet or Job, and their charge is worked out once.  An entry of a pod
-- naming DRA claims holds only for the version of the DRA objects it was worked out with.
-- Dropped with the configuration it was worked out under; full (in entries, or in bytes: a
-- pod may carry a long annotation or many containers, and the VM's memory is bounded), it
-- starts again empty.  Only for a v1 Pod: the key is read from a pod's own fields, where the
-- charge of a workload is its template's.
local REMEMBERED_MAX, REMEMBERED_BYTES = 1024, 2 * 1024 * 1024
local remembered, remembered_n, remembered_bytes, remembered_cfg = {}, 0, 0, nil

--[[
The charge of a pod in milli-GPU and a breakdown (as quota.pod_charge's, plus "pod" entries for
DRA claims and KAI annotations); nil and a message saying what to change for a value that is
illegal in its own dialect.  opts (optional): pool = the pool that serves it (default: the pool
its nodeSelector names), namespace = the request's (default: the pod's, else "default"),
lookup = function(kind, namespace, name) for DRA objects (default: gpuguard.dra), shares =
{ [container name] = milli-GPU } for the shared replica of each container 10-gpu-sharing has
just decided (then the charge is computed, never read from the gpuguard.io/charge annotation,
which is what it is computed for).  The third result is the GPU device classes of its DRA claims
(a list; .shared_claim when it names a ResourceClaim).
Without pool, lookup or shares, the answer may come from the memo: its breakdown and classes are
then read-only, shared with every copy of the pod.
]]
function M.charge(pod, cfg, opts)
    if (opts and (opts.pool ~= nil or opts.lookup ~= nil or opts.shares ~= nil))
        or type(pod) ~= "table" or pod.kind ~= "Pod" or pod.apiVersion ~= "v1" then
        return charge_of(pod, cfg, opts) -- a decision's own charge, or not a pod's
    end
    local key, version = gg.charge_key(pod, opts and opts.namespace)
    if key == nil then
        return charge_of(pod, cfg, opts)
    end
    if remembered_cfg ~= cfg then
        remembered, remembered_n, remembered_bytes, remembered_cfg = {}, 0, 0, cfg
    end
    local r = remembered[key]
    if r ~= nil and r.version == version then
        return r.total, r.breakdown, r.classes
    end
    local total, breakdown, classes = charge_of(pod, cfg, opts)
    -- Kept unless the DRA objects moved meanwhile (one was asked of the API server), or one of
    -- them could not be known in this request (gg.dra_version() is then nil).
    if version == false or gg.dra_version() == version then
        -- The key, and about 200 bytes a value of the breakdown and its copy (a read-only view
        -- holds a shadow of each table).
        local bytes = #key + 200 * (#(classes or NONE) + (type(breakdown) == "table" and #breakdown or 1))
        for _, b in ipairs(type(breakdown) == "table" and breakdown or NONE) do
            bytes = bytes + 400 * #(type(b) == "table" and type(b.items) == "table" and b.items or NONE)
        end
        if remembered_n >= REMEMBERED_MAX or remembered_bytes + bytes > REMEMBERED_BYTES then
            remembered, remembered_n, remembered_bytes = {}, 0, 0
        end
        -- Read-only: the same tables answer every later copy of the pod.
        breakdown, classes = gg.readonly(breakdown), gg.readonly(classes)
        if remembered[key] == nil then
            remembered_n, remembered_bytes = remembered_n + 1, remembered_bytes + bytes
        end
        remembered[key] = { total = total, breakdown = breakdown, classes = classes, version = version }
    end
    return total, breakdown, classes
end

-- The requests of a claim's spec whose device classes its pod was not charged for as extended
-- resources (gpu.requested knows the extended-resource names of NVIDIA's GPU classes only), as
-- a spec of their own.
local function uncharged_requests(spec)
    local devices = type(spec) == "table" and spec.devices
    local keep = {}
    for _, r in ipairs(type(devices) == "table" and list(devices.requests) or NONE) do
        local charged = true
        for _, sub in ipairs(type(r) == "table" and alternatives(r) or NONE) do
            local class = type(sub) == "table" and sub.deviceClassName
            charged = charged and type(class) == "string"
                and gpu.is_gpu_resource("deviceclass.resource.kubernetes.io/" .. class)
        end
        if not charged then
            keep[#keep + 1] = r
        end
    end
    return { devices = { requests = keep } }
end

-- What a ResourceClaim holds on its own: nothing when its pod is charged for it (a claim made
-- from the pod's template, or the scheduler's claim for extended resources the pod was charged
-- for); one GPU per request when it cannot be read.
local function claim_usage(claim, cfg)
    local spec, made_for = claim.spec, M.claim_charged_elsewhere(claim)
    if made_for == M.POD_CLAIM_NAME then
        return 0
    elseif made_for then
        spec = uncharged_requests(spec)
    end
    local meta = type(claim.metadata) == "table" and claim.metadata or NONE
    local c = M.claim_charge(cfg, spec, "ResourceClaim " .. tostring(meta.name))
    if c then
        -- The scheduler's claim holds devices its pod was charged for too: its spec only.
        return made_for and c or math.max(c, allocated_charge(claim, cfg))
    end
    local devices = type(spec) == "table" and spec.devices
    return math.max(1, #list(type(devices) == "table" and devices.requests)) * 1000
end

--- The charge the inventory counts for a running pod or a ResourceClaim: intent.charge without
--- the messages, a pod whose values are illegal counted as one GPU per GPU container (it was
--- never admitted by gpuguard; fail closed).
function M.usage_charge(pod, cfg)
    if pod.kind == "ResourceClaim" then
        return claim_usage(pod, cfg)
    end
    local total = charge_of(pod, cfg) -- the charger remembers it in C (engine/chargememo.h)
    if total then
        return total
    end
    local spec, n = k8s.pod_spec(pod), 0
    for c in k8s.containers(spec or NONE, INIT_AND_REGULAR) do
        local ok, items = pcall(gpu.requested, c)
        n = n + ((not ok or #items > 0) and 1 or 0)
    end
    return math.max(n, 1) * 1000
end

--- True when a pod asks for a GPU in any dialect (a malformed request counts as asking; so does
--- a DRA claim that cannot be read).
function M.wants_gpu(pod, cfg, namespace)
    local d = M.dialects(pod)
    if not d.dra then
        if next(d) ~= nil then
            return true
        end
        -- Another vendor's GPU, or a request for one that is refused: asked of the rest only.
        local spec = k8s.pod_spec(pod)
        return spec ~= nil and other_gpus(spec, cfg) ~= 0
    end
    if d.kai or d.hami or d.volcano or d.mig or d.shared or d["device-plugin"] or d.gpuguard or d.malformed then
        return true
    end
    local total, _, classes = M.charge(pod, cfg, { namespace = namespace })
    return classes == nil or #classes > 0 or classes.shared_claim == true or total > 0
end

--- True when the pod is on a shared GPU: anything but whole exclusive GPUs (a fraction, a MIG
--- slice, a replica, HAMi, Volcano vGPU, KAI, a DRA MIG device or a shared claim).
function M.shared(pod, cfg, namespace)
    local decision = k8s.annotation(pod, M.DECISION)
    -- "8 whole GPUs: exclusive on pool ..." names the size before the mode.
    decision = decision and (decision:match("^%d+ whole GPUs?: (.*)$") or decision)
    if decision and decision:sub(1, 10) ~= "exclusive " and decision:sub(1, 4) ~= "dra " then
        return true
    end
    local d = M.dialects(pod)
    if d.kai or d.hami or d.volcano or d.mig or d.shared or d.gpuguard then
        return true
    end
    local pool = M.pool_of(pod, cfg)
    if pool and pool.sharing ~= "exclusive" and not d.dra then
        return true
    end
    if d.dra then
        local _, _, classes = M.charge(pod, cfg, { namespace = namespace })
        for _, c in ipairs(classes or NONE) do
            if c == MIG_CLASS then
                return true
            end
        end
        return classes and classes.shared_claim == true
    end
    return false
end

return M
