--[[
05-gpu-rightsizing.lua - size GPU requests from what the workload actually used.

For a GPU workload of a listed class with at least min_history of history, the peak GPU memory
any of its pods held (rightsize.peak) times the headroom, rounded up to whole GiB, is what it
needs; the smallest allocation that holds it on the pool the sharing policy will choose
(fleet.choose for the pod's class: a MIG profile, a share of a GPU, or whole GPUs) is compared
with the allocation it asks for now.  When the new one is smaller:

  recommend  a warning and the annotation gpuguard.io/recommendation, e.g. "used at most 7.1 GiB
             of 80 over 7 days; mig-1g.10gb would hold it: set gpuguard.io/gpu-memory: 9Gi"
  apply      on a workload's pod template only: gpuguard.io/gpu-memory is set to that amount
             (a fraction annotation of the container is removed, so the memory decides), and
             10-gpu-sharing then decides the mode and pool from it as from any request; the
             annotation says what was applied and why.  Pods are never resized on their own
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

local GIB_MILLI = 1024 * rightsize.MIB_MILLI

-- rightsize.settings per configuration (nothing here writes into them): every pod review asks.
local settings_for = fleet.per_config(rightsize.settings)

-- The allocation the pod asks for now and the one its usage needs, or nil when it is not ours.
local function compare(req, pod, cfg, settings)
    if k8s.annotation(pod, rightsize.OPT_OUT) == "off" or #fleet.pools(cfg) == 0 then
        return nil
    end
    local intent = workload.intent(pod)
    if not intent or #intent ~= 1 then
        return nil -- no GPU, a malformed request (10-gpu-sharing denies it), or several containers
    end
    local class = workload.class(pod, cfg)
    if not settings.classes[class] then
        return nil
    end
    local pool, mode = fleet.choose(cfg, class, workload.asked_sharing(pod))
    if not pool then
        return nil
    end
    local usage = rightsize.peak(req, pod)
    if not usage or usage.history_s < settings.min_history_s then
        return nil
    end
    local model = fleet.model(cfg, pool)
    local e = intent[1]
    local asked = rightsize.asked_memory(e, model)
    local current = rightsize.allocation(model, mode, pool, asked)
    local need = rightsize.needed_memory(usage.peak_mib, settings.headroom)
    local better = rightsize.allocation(model, mode, pool, need)
    if not current or not better then
        return nil
    end
    return { usage = usage, current = current, better = better, need = need, asked = asked, entry = e }
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
    local smaller = better.charge < current.charge and found.need < found.asked -- only ever downward
    local at_template = req.template ~= nil
    local action = not smaller and "none" or settings.mode == "apply" and at_template and "apply" or "recommend"
    gg.rightsize_report(req.namespace, u.workload, action, current.charge, better.charge)
    if action == "none" then
        return
    end
    local memory = gg.format_quantity(found.need, "BinarySI")
    local used = string.format("used at most %s of %d over %s", rightsize.gib(u.peak_mib),
        current.memory_milli // GIB_MILLI, rightsize.span(math.min(u.history_s, u.window_s)))
    local msg
    if action == "apply" then
        apply(pod, found.entry.container, found.need)
        msg = string.format("applied %s: %s: %s, %s holds it", workload.MEMORY, memory, used, better.name)
    else
        msg = string.format("%s; %s would hold it: set %s: %s", used, better.name, workload.MEMORY, memory)
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
