--[[
05-gpu-rightsizing.lua - size GPU requests from what the workload actually used.

For a GPU workload of a listed class with at least min_history of history, the peak GPU memory
any of its pods held (rightsize.peak) times the headroom, rounded up to whole GiB, is what it
needs.  The cheapest allocation that holds it (a MIG profile, a share of a GPU, or whole GPUs),
over every pool the pod's class may use and its own choice allows (fleet.candidates,
choice.pick; cost: charge in GPU-equivalents times pools[].cost), is compared with what the
sharing policy gives it now.  When the new one costs less:

  recommend  a warning and the annotation gpuguard.io/recommendation, e.g. "used at most 7.1 GiB
             of 80 over 7 days; mig-1g.10gb would hold it: set gpuguard.io/gpu-memory: 9Gi"
  apply      on a workload's pod template only: gpuguard.io/gpu-memory is set to that amount
             (a fraction annotation of the container is removed, so the memory decides) and,
             when the smaller request alone would be routed to another pool, the pool is chosen
             as a user would (its node selector; gpuguard.io/gpu-model for a pool without one),
             so 10-gpu-sharing puts it where the recommendation said; the annotation says what
             was applied and why.  Pods are never resized on their own
             (Kueue reserves quota from the template): a pod gets the recommendation.

A template is the Pod gpuguard builds from a workload's pod template, at workload admission in
the webhook and in `gpuguard check` and `gpuguard test`: req.template is the template's path
("spec.template"), set by gpuguard and nil for a Pod under review, whatever its owner.
Only ever downward, never below peak x headroom; never for a pod or template annotated
gpuguard.io/rightsizing: off, a pod with several GPU containers, or a class not listed.  No data
(source off, not yet synced, stale, or too little history) means nothing is done.  Each finding
is reported for the gpuguard_rightsizing_* metrics.

Config keys: rightsizing.mode, headroom, min_history, classes (see lua/rightsize.lua); pools,
classes, default_class (fleet.lua).  Idempotent: a template it set already asks for what it
needs, so a second call finds nothing smaller.
]]

local gg = require "gpuguard"
local k8s = require "k8s"
local fleet = require "fleet"
local workload = require "workload"
local rightsize = require "rightsize"
local choice = require "choice"

local GIB_MILLI = 1024 * rightsize.MIB_MILLI

-- rightsize.settings per configuration (nothing here writes into them): every pod review asks.
local settings_for = fleet.per_config(rightsize.settings)

-- A selector_words for the pool, defined below.
local selector_words

--[[
The options a recommendation may name: a memory request on an exclusive pool is denied under
exclusive.fractions: deny; and a pool the pod must be pinned to (not the one the smaller request
would be routed to) needs a node selector of its own, or a model no other option has, for the
pin to say which pool.
]]
local function reachable(options, routed, cfg)
    local deny = cfg.exclusive and cfg.exclusive.fractions == "deny"
    local out = { named = options.named }
    for _, c in ipairs(options) do
        local model_of_others = 0
        for _, o in ipairs(options) do
            if o.pool ~= c.pool and o.pool.model == c.pool.model then
                model_of_others = model_of_others + 1
            end
        end
        local pinnable = (routed and routed.pool == c.pool) or selector_words(c.pool) or model_of_others == 0
        if pinnable and not (deny and c.mode == "exclusive") then
            out[#out + 1] = c
        end
    end
    return out
end

-- The allocation the pod gets now and the cheapest one its usage needs, or nil when it is not
-- ours.  pin: the pool of the better one must be written down, since the smaller request alone
-- would be routed elsewhere.
local function compare(req, pod, cfg, settings)
    if k8s.annotation(pod, rightsize.OPT_OUT) == "off" or #fleet.pools(cfg) == 0 then
        return nil
    end
    local asks = workload.intent(pod)
    if not asks or #asks ~= 1 then
        return nil -- no GPU, a malformed request (10-gpu-sharing denies it), or several containers
    end
    local class = workload.class(pod, cfg)
    if not settings.classes[class] then
        return nil
    end
    local e, spec, mode = asks[1], k8s.pod_spec(pod), workload.asked_sharing(pod)
    local whole = not e.fraction_milli and not e.memory_milli
    if whole and e.whole > 1 then
        return nil -- several GPUs are asked for more than their memory (tensor parallelism)
    end
    local now = fleet.candidates(cfg, class, mode, whole)
    local options = fleet.candidates(cfg, class, mode, false)
    now = now and choice.pick(pod, spec, cfg, now, class)
    options = options and choice.pick(pod, spec, cfg, options, class)
    if not now or not options then
        return nil -- 10-gpu-sharing says why
    end
    local usage = rightsize.peak(req, pod)
    if not usage or usage.history_s < settings.min_history_s then
        return nil
    end
    local current = rightsize.placed(cfg, now, function(model) return rightsize.asked_memory(e, model) end)
    if not current then
        return nil
    end
    local need = rightsize.needed_memory(usage.peak_mib, settings.headroom)
    local routed = rightsize.placed(cfg, options, need)
    local better = rightsize.placed(cfg, reachable(options, routed, cfg), need, { max_charge = current.charge })
    if not better then
        return nil
    end
    return { usage = usage, current = current, better = better, need = need, entry = e,
        pin = not routed or routed.pool ~= better.pool }
end

-- A pool's node selector as "key: value, ..." (sorted), or nil when gpuguard does not place the
-- pool's pods (placement: kueue) or it has none.
function selector_words(pool)
    local sel = fleet.places(pool) and pool.node_selector
    if not sel or next(sel) == nil then
        return nil
    end
    local keys = {}
    for k in pairs(sel) do
        keys[#keys + 1] = k
    end
    table.sort(keys)
    for i, k in ipairs(keys) do
        keys[i] = k .. ": " .. sel[k]
    end
    return table.concat(keys, ", ")
end

-- How the choice of pool is written, as a user would: its node selector, or its GPU model.
local function pin_words(pool, cfg)
    local sel = selector_words(pool)
    if sel then
        return "nodeSelector " .. sel
    end
    return choice.MODEL_ANNOTATION .. ": " .. fleet.model(cfg, pool).name
end

local function pin(pod, pool, cfg)
    if selector_words(pool) then
        local spec = k8s.pod_spec(pod)
        for k, v in pairs(pool.node_selector) do
            k8s.set_node_selector(spec, k, v)
        end
        choice.disown(pod, pool.node_selector) -- a choice now, which no later decision undoes
    else
        k8s.set_annotation(pod, choice.MODEL_ANNOTATION, fleet.model(cfg, pool).name)
    end
end

-- Set gpu-memory on the template and drop what would outweigh it.
local function apply(pod, c, need)
    k8s.set_annotation(pod, workload.MEMORY, gg.format_quantity(need, "BinarySI"))
    k8s.remove_annotation(pod, workload.FRACTION)
    k8s.remove_annotation(pod, workload.FRACTION .. "." .. c.name)
    k8s.remove_annotation(pod, workload.MEMORY .. "." .. c.name)
end

local function rightsize_pod(req, pod, cfg)
    local settings = settings_for(cfg)
    if settings.mode == "off" then
        return
    end
    local found = compare(req, pod, cfg, settings)
    if not found then
        return
    end
    local u, current, better = found.usage, found.current, found.better
    local smaller = better.cost < current.cost and found.need < current.asked -- only ever downward
    local at_template = req.template ~= nil
    local action = not smaller and "none" or settings.mode == "apply" and at_template and "apply" or "recommend"
    gg.rightsize_report(req.namespace, u.workload, action, current.charge, better.charge)
    if action == "none" then
        return
    end
    local set = string.format("%s: %s", workload.MEMORY, gg.format_quantity(found.need, "BinarySI"))
    local holder = better.name
    if found.pin then
        set = set .. " and " .. pin_words(better.pool, cfg)
        holder = string.format("%s on pool %s", better.name, better.pool.name)
    end
    local used = string.format("used at most %s of %d over %s", rightsize.gib(u.peak_mib),
        current.memory_milli // GIB_MILLI, rightsize.span(math.min(u.history_s, u.window_s)))
    local msg
    if action == "apply" then
        apply(pod, found.entry.container, found.need)
        if found.pin then
            pin(pod, better.pool, cfg)
        end
        msg = string.format("applied %s: %s, %s holds it", set, used, holder)
    else
        msg = string.format("%s; %s would hold it: set %s", used, holder, set)
    end
    req:warn(msg)
    k8s.set_annotation(pod, rightsize.ANNOTATION, msg)
    req:audit("recommendation", msg)
end

return {
    name = "rightsizing",
    description = "Recommends or applies smaller GPU requests from the GPU memory workloads used.",
    match = { kinds = { "Pod" }, operations = { "CREATE" } },
    check = rightsize.check,
    mutate = rightsize_pod,
}
