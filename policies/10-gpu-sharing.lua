--[[
10-gpu-sharing.lua - turn what a GPU pod asks for into what the fleet runs.

A pod says what it needs: whole GPUs (nvidia.com/gpu), or a fraction or an amount of GPU memory
(gpuguard.io/gpu-fraction, gpuguard.io/gpu-memory, per container with .<container>), and
optionally a workload class (label gpuguard.io/workload-class) and a sharing mode
(annotation gpuguard.io/sharing), and optionally a pool of its own choice (a pool or GPU
Feature Discovery label it selects, gpuguard.io/gpu-model: choice.lua).  This policy takes the
class's pools in order (fleet.candidates: whole GPUs to exclusive pools first when the class
allows it), keeps those the pod's choice allows (a choice none satisfies is denied with the
pools that would), and picks the first whose backend can hold every container (a class without
pools of its own: the first, as it always has).  It rewrites the containers into that backend's
own resource names, and records on the pod:

  gpuguard.io/decision  what was chosen and why, for people
  gpuguard.io/pool      the pool (20-gpu-placement adds its selector and tolerations)
  gpuguard.io/charge    the pod's charge in milli-GPU, for people; intent.charge reads it only
                        for the share of a time-sliced replica, which resources cannot say

A pod already written in a backend's own dialect (DRA claims, KAI annotations, HAMi or Volcano
vGPU resources; see intent.lua) is passed through: charged, checked and given the pool that
runs that dialect (a pool's device_classes or scheduler_name), with its scheduler name set.
A pod that names a pool's own device plugin resource (nvidia.com/mig-<profile> of a mixed-MIG
pool's model, a time-slicing or MPS pool's shared_resource) keeps it and gets that pool.  Either
is denied when its own choice of pool names labels that pool's nodes lack.

Backends:
  exclusive     nvidia.com/gpu: N whole GPUs (a fraction above 1 rounds up, or is denied)
  mig           the smallest profile of the pool's model that covers the memory and compute;
                mixed strategy: nvidia.com/mig-<profile>: 1; single strategy: nvidia.com/gpu: 1
                and a nodeSelector on the MIG product label
  time-slicing, mps
                one replica of the pool's shared resource and a nodeSelector on
                nvidia.com/gpu.sharing-strategy; for mps with mps_env, CUDA_MPS_* variables;
                charged at least the replica's slot (1/R) unless mps_env holds it to its share
  hami          nvidia.com/gpu: 1, nvidia.com/gpumem (MiB), nvidia.com/gpucores (percent)
  kai           the gpu-fraction or gpu-memory annotation and schedulerName kai-scheduler

Config keys: pools, classes (with classes.<name>.namespaces: workload.class_allowed, and
classes.<name>.pools: fleet.candidates),
default_class, exclusive.fractions, gpu_models (see fleet.lua).
Idempotent: everything is recomputed from the pod's own request annotations and set, never
appended, so a pod it already rewrote comes out unchanged.
]]

local k8s = require "k8s"
local gpu = require "gpu"
local quota = require "quota"
local fleet = require "fleet"
local workload = require "workload"
local rightsize = require "rightsize"
local intent = require "intent"
local choice = require "choice"

local DECISION = intent.DECISION
local POOL = intent.POOL
local CHARGE = intent.CHARGE
local MIB_MILLI = 1024 * 1024 * 1000
local OWN = { DECISION, POOL, CHARGE, choice.OWN_SELECTOR } -- the annotations this policy owns
-- The kinds of gpu.requested resources the backends write, besides nvidia.com/gpu, which each
-- backend sets or drops itself.
local REWRITTEN = { mig = true, shared = true, hami = true }

local function ceil_div(a, b)
    return (a + b - 1) // b
end

--[[
The writes a backend wants, kept in an edit (a list of calls) until a pool is chosen: a pool that
cannot hold one container must leave no trace on the pod while the next pool is tried.
]]
local function put(edit, fn, ...)
    edit[#edit + 1] = table.pack(fn, ...)
end

local function apply(edit)
    for _, call in ipairs(edit) do
        call[1](table.unpack(call, 2, call.n))
    end
end

-- Set a GPU resource in requests and limits alike (extended resources must be equal).
local function set_gpu(edit, c, name, value)
    put(edit, k8s.set_resource, c, "limits", name, value)
    put(edit, k8s.set_resource, c, "requests", name, value)
end

local function drop_gpu(edit, c, name)
    put(edit, k8s.remove_resource, c, "limits", name)
    put(edit, k8s.remove_resource, c, "requests", name)
end

local function set_scheduler(pod, name)
    k8s.pod_spec(pod).schedulerName = name
end

-- The share of one GPU an intent asks for, in milli-GPU (memory counts against the model).
local function share_of(e, model)
    local share = e.fraction_milli or 0
    if e.memory_milli then
        share = math.max(share, ceil_div(e.memory_milli * 1000, model.memory_milli))
    end
    if share == 0 and e.whole then
        share = e.whole * 1000
    end
    return share
end

local backends = {}

function backends.exclusive(e, pool, model, cfg, notes, _, edit)
    local n = e.whole or 0
    n = math.max(n, ceil_div(share_of(e, model), 1000))
    local asked_fraction = e.fraction_milli or (e.memory_milli and share_of(e, model))
    if asked_fraction and asked_fraction % 1000 ~= 0 and not e.whole then
        local mode = cfg.exclusive and cfg.exclusive.fractions or "round-up"
        if mode == "deny" then
            return nil, string.format("pool %s gives whole GPUs only; ask for a whole number of GPUs instead of %s",
                pool.name, quota.format_gpus(asked_fraction))
        end
        -- Of what: a fraction is of a GPU; an amount of memory is a share of this pool's model.
        local asked = e.fraction_milli and quota.format_gpus(asked_fraction)
            or string.format("%s of GPU memory is %s of one %s,", rightsize.gib(e.memory_milli / rightsize.MIB_MILLI),
                quota.format_gpus(asked_fraction), model.name)
        notes[#notes + 1] = string.format("%s rounded up to %d whole GPU%s", asked, n, n == 1 and "" or "s")
    end
    set_gpu(edit, e.container, "nvidia.com/gpu", tostring(n))
    return { charge = n * 1000, detail = string.format("%d whole %s", n, model.name) }
end

function backends.mig(e, pool, model, _, _, _, edit)
    if e.whole and e.whole > 1 and not e.fraction_milli and not e.memory_milli then
        return nil, "a MIG slice is at most one GPU; ask for a fraction or an amount of GPU memory, or use a training class for several GPUs"
    end
    -- e itself when it asks for memory or compute: pick_profile reads no other field of it.
    local want = e
    if not e.memory_milli and not e.fraction_milli then
        want = { fraction_milli = 1000 }
    end
    local profile, msg = gpu.pick_profile(model, want)
    if not profile then
        return nil, msg .. "; ask for less or use another class"
    end
    local c = e.container
    -- What it asked for in words, memory and compute joined by " and " (no table to concat).
    local asked = e.memory_milli and gpu.format_memory(e.memory_milli)
    local compute = e.fraction_milli == 1000 and "a whole GPU"
        or e.fraction_milli and quota.format_gpus(e.fraction_milli) .. " of the compute"
    if compute then
        asked = asked and asked .. " and " .. compute or compute
    end
    local why = string.format("the smallest %s profile with %s", model.name, asked or "a whole GPU")
    if pool.mig_strategy == "single" then
        local slot = gpu.profile(model, pool.mig_profile)
        if profile.slices > slot.slices or profile.memory_milli > slot.memory_milli then
            return nil, string.format("pool %s is split into %s; %s needs %s; ask for less", pool.name,
                slot.name, c.name, profile.name)
        end
        if slot.name ~= profile.name then
            -- Every device of the pool is a slot: say what was needed and what it gets.
            why = string.format("the profile pool %s is split into (%s needs %s, %s)", pool.name, c.name,
                profile.name, why)
        end
        profile = slot
        set_gpu(edit, c, "nvidia.com/gpu", "1")
    else
        drop_gpu(edit, c, "nvidia.com/gpu")
        set_gpu(edit, c, profile.resource, "1") -- gpu.mig_resource(profile), already in the profile
    end
    return {
        charge = profile.charge_milli, -- gpu.charge_milli(model, profile.name), without the lookup
        detail = profile.name .. ", " .. why,
        selector = pool.mig_strategy == "single"
            and { ["nvidia.com/gpu.product"] = gpu.mig_product_label(model, profile.name, pool.product) } or nil,
    }
end

-- ", or use a class with exclusive GPUs (training)" when a class pods of namespace may use has
-- them, else "": an alternative the namespace cannot take leads nowhere.
local function exclusive_alternative(cfg, namespace)
    local classes = fleet.classes_for(cfg, namespace, function(e) return e.mode == "exclusive" end)
    return #classes > 0 and string.format(", or use a class with exclusive GPUs (%s)", table.concat(classes, ", ")) or ""
end

local function shared(mode)
    return function(e, pool, model, cfg, _, _, edit, namespace)
        local share = share_of(e, model)
        if share > 1000 then
            return nil, string.format("a %s GPU is shared, one replica at most; ask for at most 1 GPU%s", mode,
                exclusive_alternative(cfg, namespace))
        end
        local c = e.container
        local resource = pool.shared_resource or "nvidia.com/gpu"
        if resource ~= "nvidia.com/gpu" then
            drop_gpu(edit, c, "nvidia.com/gpu")
        end
        set_gpu(edit, c, resource, "1")
        if mode == "mps" and pool.mps_env then
            -- The limits that hold the replica to its share: compute, and memory (asked for, or
            -- the share of the GPU's).
            put(edit, k8s.set_env, c, "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", tostring(ceil_div(share, 10)))
            local mib = e.memory_milli and ceil_div(e.memory_milli, MIB_MILLI) or ceil_div(model.memory_mib * share, 1000)
            put(edit, k8s.set_env, c, "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT", "0=" .. mib .. "M")
        end
        local replicas = pool.replicas or 1
        local slot = ceil_div(1000, replicas)
        if intent.isolates(pool) or share >= slot then
            return {
                charge = share,
                detail = string.format("a %s replica of %s, charged %s", mode, model.name, quota.format_gpus(share)),
                selector = { ["nvidia.com/gpu.sharing-strategy"] = mode },
            }
        end
        return {
            charge = slot,
            detail = string.format("a %s replica of %s, charged %s: a replica holds one of the GPU's %d %s slots whatever it asks (asked %s)",
                mode, model.name, quota.format_gpus(slot), replicas, mode, quota.format_gpus(share)),
            selector = { ["nvidia.com/gpu.sharing-strategy"] = mode },
        }
    end
end

backends["time-slicing"] = shared("time-slicing")
backends.mps = shared("mps")

function backends.hami(e, pool, model, _, _, _, edit)
    local share = share_of(e, model)
    if share > 1000 then
        return nil, "a HAMi share is at most one GPU; ask for at most 1 GPU"
    end
    local c = e.container
    set_gpu(edit, c, "nvidia.com/gpu", "1")
    local mib = e.memory_milli and ceil_div(e.memory_milli, MIB_MILLI) or ceil_div(model.memory_mib * share, 1000)
    set_gpu(edit, c, "nvidia.com/gpumem", tostring(mib))
    set_gpu(edit, c, "nvidia.com/gpucores", tostring(ceil_div(share, 10)))
    return { charge = share, detail = string.format("%d MiB and %d%% of a %s", mib, ceil_div(share, 10), model.name) }
end

function backends.kai(e, pool, model, _, _, pod, edit)
    local share = share_of(e, model)
    if share > 1000 then
        return nil, "a KAI fraction is at most one GPU; ask for at most 1 GPU"
    end
    local c = e.container
    if share == 1000 then
        set_gpu(edit, c, "nvidia.com/gpu", "1")
    else
        drop_gpu(edit, c, "nvidia.com/gpu")
        if e.memory_milli and not e.fraction_milli then
            put(edit, k8s.set_annotation, pod, "gpu-memory", tostring(ceil_div(e.memory_milli, MIB_MILLI)))
        else
            put(edit, k8s.set_annotation, pod, "gpu-fraction", quota.format_milli(share))
        end
    end
    put(edit, set_scheduler, pod, pool.scheduler_name or "kai-scheduler")
    return { charge = share, detail = string.format("%s of %s through KAI", quota.format_gpus(share), model.name) }
end

-- The nodeSelector entries the pod gets for pool: the backend's (selector, may be nil) and the
-- pool's own, which 20-gpu-placement writes; none for a pool gpuguard does not place.
local function selector_writes(pool, selector)
    if not fleet.places(pool) then
        return {}
    end
    local out = {}
    for k, v in pairs(pool.node_selector or {}) do
        out[k] = v
    end
    for k, v in pairs(selector or {}) do
        out[k] = v
    end
    return out
end

-- Write down the decision, pool and charge on the pod, and the nodeSelector entries gpuguard
-- adds (own: choice.own_entries, worked out before they are written), and audit the decision.
local function record(req, pod, decision, pool, total, own)
    k8s.set_annotation(pod, DECISION, decision)
    k8s.set_annotation(pod, POOL, pool.name)
    k8s.set_annotation(pod, CHARGE, tostring(total))
    if own then
        k8s.set_annotation(pod, choice.OWN_SELECTOR, own)
    else
        k8s.remove_annotation(pod, choice.OWN_SELECTOR)
    end
    req:audit("decision", decision)
    return true
end

-- A pod whose dialect or resource only one pool runs may still choose (choice.lua): a choice
-- that pool does not satisfy is refused here, before its selector is written over it.  Returns
-- true when the pod may go to pool.
local function chose_otherwise(req, pod, cfg, pool, what)
    local spec = k8s.pod_spec(pod)
    choice.forget_own(pod, spec, cfg)
    local ch, msg = choice.of(pod, spec, cfg)
    if ch == nil or (ch and choice.allows(ch, cfg, pool)) then
        return false
    end
    if ch then
        local others = choice.pools_that_would(ch, cfg)
        msg = string.format("%s runs on pool %s, and the pod asks for %s, which it does not have; %s", what, pool.name,
            ch.says, others and "pools that do: " .. others .. "; ask for a GPU in a form one of them runs"
                or "no pool has it; remove it")
    end
    req:deny(msg)
    return true
end

-- A pod written in a backend's own dialect keeps it: checked, charged and given the pool that
-- runs that dialect (20-gpu-placement adds its selector and tolerations), never rewritten.
local function pass_through(req, pod, cfg, dialect)
    local opts = { namespace = req.namespace }
    local total, breakdown, classes = intent.charge(pod, cfg, opts)
    if not total then
        req:deny(breakdown)
        return
    end
    -- The pool that charge was worked out on (its nodeSelector's): chose_otherwise may forget
    -- gpuguard's own entries below, and only the pool is read of them.
    local charged_on = intent.pool_of(pod, cfg)
    if dialect == "dra" and #classes == 0 and not classes.shared_claim then
        return -- claims for devices that are not GPUs
    end
    -- intent.wants_gpu would say true of it (GPU classes, or a backend's dialect), and nothing
    -- below removes what makes it so: its charge need not be worked out again to learn it.
    workload.settle_wants_gpu(pod)
    local pool, msg = intent.serving_pool(cfg, dialect, classes)
    if not pool then
        req:deny(msg)
        return
    end
    if chose_otherwise(req, pod, cfg, pool, intent.DIALECT_WORDS[dialect]) then
        return
    end
    local scheduler = dialect ~= "dra" and intent.pool_scheduler(pool)
    if scheduler then
        local spec = k8s.pod_spec(pod)
        local named = spec.schedulerName
        if type(named) == "string" and named ~= "default-scheduler" and named ~= scheduler then
            req:deny(string.format("pool %s runs these pods with schedulerName %s, and the pod names %s; set spec.schedulerName: %s",
                pool.name, scheduler, named, scheduler))
            return
        end
        spec.schedulerName = scheduler
    end
    if pool ~= charged_on then -- a pod made from a template gpuguard placed has its pool already
        opts.pool = pool
        total, breakdown = intent.charge(pod, cfg, opts)
    end
    local decision = string.format("%s on pool %s (passed through): %s", dialect, pool.name,
        quota.describe(total, breakdown))
    local own = choice.own_entries(k8s.pod_spec(pod), selector_writes(pool))
    return record(req, pod, decision, pool, total, own)
end

-- The pool that serves a device plugin resource a container names itself: the first mixed-MIG
-- pool whose model has the MIG profile (a whole MIG device, not a shared replica of one), or the
-- time-slicing or MPS pool renaming its replicas to it; nil for other resources.
local function pool_serving(cfg, resource)
    local profile, shared = gpu.mig_profile_of(resource)
    for _, p in ipairs(fleet.pools(cfg)) do
        if profile and not shared and p.sharing == "mig" and p.mig_strategy ~= "single"
            and gpu.profile(fleet.model(cfg, p), profile) then
            return p
        elseif (p.sharing == "time-slicing" or p.sharing == "mps") and p.shared_resource == resource then
            return p
        end
    end
    return nil
end

-- A pod that names a pool's own resource (nvidia.com/mig-1g.10gb, a renamed shared replica)
-- keeps it and gets the pool that serves it: without the pool's selector and toleration no
-- node would take it.  Resources of two pools in one pod are denied.
local function place_by_resource(req, pod, cfg)
    local pool, named
    for c in k8s.containers(k8s.pod_spec(pod)) do
        for _, r in ipairs(gpu.requested(c)) do
            local p = pool_serving(cfg, r.resource)
            if p and pool and p ~= pool then
                req:deny(string.format("%s is served by pool %s and %s by pool %s; ask for the resources of one pool",
                    named, pool.name, r.resource, p.name))
                return
            end
            pool, named = pool or p, named or (p and r.resource)
        end
    end
    if not pool or chose_otherwise(req, pod, cfg, pool, named) then
        return
    end
    local total, breakdown = intent.charge(pod, cfg, { pool = pool, namespace = req.namespace })
    if not total then
        req:deny(breakdown)
        return
    end
    local decision = string.format("%s on pool %s (asked for by resource): %s", named, pool.name,
        quota.describe(total, breakdown))
    local own = choice.own_entries(k8s.pod_spec(pod), selector_writes(pool))
    return record(req, pod, decision, pool, total, own)
end

--[[
What the pod gets on a candidate pool (fleet.candidates' { pool, mode }): { edit, total, parts,
notes, selector, shares } with the writes not yet made; or nil and why the pool cannot hold it (a
stray replica, several whole GPUs on a shared GPU, a container the backend cannot fit).
whole_only: the pod asks for whole GPUs only and names no sharing mode.
]]
local function plan_for(pod, asks, candidate, cfg, class, whole_only, namespace)
    local pool, mode = candidate.pool, candidate.mode
    local stray = workload.stray_replicas(pod, asks, pool)
    if stray then
        return nil, stray
    end
    if whole_only and mode ~= "exclusive" then
        -- Whole GPUs on a pool that shares: one GPU is a full share; more needs exclusive GPUs.
        for _, e in ipairs(asks) do
            if e.whole > 1 then
                return nil, string.format("class %s shares GPUs (%s) and %s asks for %d; ask for at most 1 GPU or a fraction%s",
                    class, table.concat(fleet.class_modes(cfg, class), ", "), e.container.name, e.whole,
                    exclusive_alternative(cfg, namespace))
            end
        end
    end
    local model = fleet.model(cfg, pool)
    local plan = { edit = {}, total = 0, parts = {}, notes = {} }
    plan.shares = (mode == "time-slicing" or mode == "mps") and {} or nil
    for _, e in ipairs(asks) do
        if e.fraction_milli or e.memory_milli then
            -- gpuguard's annotation is the request: device plugin resources beside it are what an
            -- earlier decision wrote (a template whose request changed), and give way to this one.
            for _, r in ipairs(gpu.requested(e.container)) do
                if REWRITTEN[r.kind] then
                    drop_gpu(plan.edit, e.container, r.resource)
                end
            end
        end
        local got, err = backends[mode](e, pool, model, cfg, plan.notes, pod, plan.edit, namespace)
        if not got then
            return nil, string.format("container %s: %s", e.container.name, err)
        end
        plan.total = plan.total + got.charge
        if plan.shares then
            plan.shares[tostring(e.container.name)] = got.charge
        end
        plan.parts[#plan.parts + 1] = e.container.name .. " gets " .. got.detail
        if got.selector then
            plan.selector = plan.selector or {}
            for k, v in pairs(got.selector) do
                plan.selector[k] = v
            end
        end
    end
    return plan
end

-- The denial when no pool of the class can hold the pod: each pool tried and why not, or the
-- reason alone when it is the same for each.
local function cannot_hold(class, failures)
    local each, same = {}, true
    for i, f in ipairs(failures) do
        each[i] = string.format("pool %s: %s", f.pool.name, f.err)
        same = same and f.err == failures[1].err
    end
    if same then
        return failures[1].err
    end
    return string.format("no pool of class %s can hold the pod: %s", class, table.concat(each, "; "))
end

local function decide(req, pod, cfg)
    if #fleet.pools(cfg) == 0 then
        return
    end
    local dialects = intent.dialects(pod, true)
    if not dialects.gpuguard then -- gpuguard's own request wins over what a backend wrote for it
        local dialect, msg = intent.foreign(dialects)
        if msg then
            req:deny(msg)
            return
        elseif dialect then
            return pass_through(req, pod, cfg, dialect)
        end
    end
    local asks, msg = workload.intent(pod)
    if not asks then
        req:deny(msg)
        return
    end
    if #asks == 0 then
        -- dialects holds mig or shared when a container names such a resource; for a pod
        -- without a GPU, the common case, nothing more is read.
        return (dialects.mig or dialects.shared) and place_by_resource(req, pod, cfg)
    end
    local class, why = workload.class(pod, cfg)
    local allowed, refusal = workload.class_allowed(class, why, req.namespace, cfg)
    if not allowed then
        req:deny(refusal)
        return
    end
    local fractional, whole_gpus = false, 0
    for _, e in ipairs(asks) do
        fractional = fractional or e.fraction_milli ~= nil or e.memory_milli ~= nil
        whole_gpus = whole_gpus + (e.whole or 0)
    end
    local asked = workload.asked_sharing(pod)
    local candidates, none = fleet.candidates(cfg, class, asked, not fractional)
    if not candidates then
        req:deny(none)
        return
    end
    local spec = k8s.pod_spec(pod)
    choice.forget_own(pod, spec, cfg)
    local picked, why_not = choice.pick(pod, spec, cfg, candidates, class, req.namespace)
    if not picked then
        req:deny(why_not)
        return
    end
    local plan, pool, mode
    local failures = {}
    for i, c in ipairs(picked) do
        if i > 1 and not picked.named then
            break -- a class without pools of its own: the first pool, whether it holds the pod or not
        end
        local err
        plan, err = plan_for(pod, asks, c, cfg, class, not asked and not fractional, req.namespace)
        if plan then
            pool, mode = c.pool, c.mode
            plan.sized = c.sized
            break
        end
        failures[#failures + 1] = { pool = c.pool, err = err }
    end
    if not plan then
        req:deny(cannot_hold(class, failures))
        return
    end
    apply(plan.edit)
    local selector = {}
    for k, v in pairs(plan.selector or {}) do -- none for mixed MIG, exclusive, HAMi or KAI
        if not choice.keeps(spec, cfg, pool, k) then
            selector[k] = v
        end
    end
    local writes = selector_writes(pool, selector)
    local own = choice.own_entries(spec, writes)
    if fleet.places(pool) then
        for k, v in pairs(selector) do
            k8s.set_node_selector(spec, k, v)
        end
    end
    for _, note in ipairs(plan.notes) do
        req:warn(note)
    end
    local total = plan.total
    if plan.shares then
        -- The quota holds the pod's replicas against the charge recorded here: it must cover
        -- the whole pod (another container's MIG devices or DRA requests too), not only the
        -- replicas decided above.
        total, msg = intent.charge(pod, cfg, { pool = pool, namespace = req.namespace, shares = plan.shares })
        if not total then
            req:deny(msg)
            return
        end
    end
    local decision = string.format("%s on pool %s for class %s (%s): %s", mode, pool.name, class, why,
        table.concat(plan.parts, "; "))
    if plan.sized then -- the size of the request, not the class's first pool, chose exclusive GPUs
        decision = string.format("%d whole GPU%s: %s", whole_gpus, whole_gpus == 1 and "" or "s", decision)
    end
    if mode ~= "exclusive" then
        -- A whole GPU turned into a share no longer shows as nvidia.com/gpu: write the request
        -- down as a full share, so the API server's second call decides the same again.
        for _, e in ipairs(asks) do
            if e.whole and not e.fraction_milli and not e.memory_milli then
                k8s.set_annotation(pod, workload.FRACTION .. "." .. e.container.name, "1")
            end
        end
    end
    return record(req, pod, decision, pool, total, own)
end

--[[
The decision, pool and charge annotations are gpuguard's own: when this policy decides nothing
for a pod (no pools, no GPU asked through gpuguard, a denial), any the pod brought with it are
removed, so nobody can set a charge of their own and slip past the quota.
]]
local function rewrite(req, pod, cfg)
    if not decide(req, pod, cfg) then
        for _, key in ipairs(OWN) do
            k8s.remove_annotation(pod, key)
        end
    end
end

return {
    name = "gpu-sharing",
    description = "Chooses the sharing mode and pool of GPU pods and rewrites their GPU requests.",
    match = { kinds = { "Pod" }, operations = { "CREATE" } },
    check = function(cfg)
        fleet.check(cfg)
        intent.check(cfg)
        if cfg.exclusive ~= nil and cfg.exclusive.fractions ~= nil and cfg.exclusive.fractions ~= "round-up" and
            cfg.exclusive.fractions ~= "deny" then
            error("exclusive.fractions: must be round-up or deny", 0)
        end
    end,
    mutate = rewrite,
    remember = { "mutate" }, -- its decision is the pod's and the configuration's alone
}
