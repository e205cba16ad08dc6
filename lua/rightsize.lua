--[[
rightsize.lua - how much GPU a workload needs from what it used: its peak GPU memory over the
configured window (DCGM exporter's history in Prometheus, through gpuguard.rightsize), times a
headroom, turned into the smallest allocation of a pool's GPU model that holds it (a MIG profile,
a share of a GPU, or whole GPUs).

Configuration (rightsizing:, checked by M.check):
  mode         off | recommend | apply   (default off)
  headroom     peak x headroom must fit; a number from 1 to 10 (default 1.25)
  min_history  at least this span of samples before acting, e.g. 1h, 2d (default 1h)
  classes      workload classes it acts on (default inference, interactive, batch: never
               training unless listed)
  prometheus, window, refresh, metric, labels, max_series   read by the server's usage source
               (rightsize.h; max_series, the most series one answer may have, checked here too)

Must not: keep state, or change the pod.
]]

local gg = require "gpuguard"
local k8s = require "k8s"
local gpu = require "gpu"
local quota = require "quota"
local fleet = require "fleet"
local intent = require "intent"

local M = {}

M.ANNOTATION = "gpuguard.io/recommendation"
M.OPT_OUT = "gpuguard.io/rightsizing" -- "off" on a pod or template: never rightsized

local MIB_MILLI = 1024 * 1024 * 1000
local GIB_MILLI = 1024 * MIB_MILLI
local DEFAULT_CLASSES = { "inference", "interactive", "batch" }
local MODES = { off = true, recommend = true, apply = true }

--- The rightsizing settings with their defaults: { mode, headroom, min_history_s, classes }
--- (classes a set).  Call M.check first: this trusts the values.
function M.settings(cfg)
    local rs = cfg.rightsizing or {}
    local classes = {}
    for _, c in ipairs(rs.classes or DEFAULT_CLASSES) do
        classes[c] = true
    end
    return {
        mode = rs.mode or "off",
        headroom = rs.headroom or 1.25,
        min_history_s = fleet.seconds(rs.min_history or "1h"),
        classes = classes,
    }
end

--- Raise with the key path when the rightsizing: section is wrong.
function M.check(cfg)
    local rs = cfg.rightsizing
    if rs == nil then
        return
    end
    if type(rs) ~= "table" then
        error("rightsizing: must be a mapping", 0)
    end
    -- YAML 1.1 reads an unquoted off as false.
    if rs.mode ~= nil and rs.mode ~= false and not MODES[rs.mode] then
        error("rightsizing.mode: must be off, recommend or apply", 0)
    end
    local h = rs.headroom
    if h ~= nil and (type(h) ~= "number" or h < 1 or h > 10) then
        error("rightsizing.headroom: must be a number from 1 to 10, such as 1.25", 0)
    end
    if rs.min_history ~= nil and (fleet.seconds(rs.min_history) or 0) == 0 then
        error("rightsizing.min_history: must be a duration such as 1h or 2d", 0)
    end
    local ms = rs.max_series
    if ms ~= nil and (math.type(ms) ~= "integer" or ms < 1 or ms > 1000000) then
        error("rightsizing.max_series: must be a whole number from 1 to 1000000", 0)
    end
    if rs.classes ~= nil then
        if type(rs.classes) ~= "table" then
            error("rightsizing.classes: must be a list of workload classes", 0)
        end
        for i, c in ipairs(rs.classes) do
            if type(c) ~= "string" then
                error(string.format("rightsizing.classes[%d]: must be a class name", i - 1), 0)
            end
        end
    end
end

--[[
The usage history of the workload obj belongs to: for a Pod, the workload of its controller owner
(a Deployment for its ReplicaSet's pods, a CronJob for its Jobs' pods), else of its name; for a
workload object, itself.  Returns { workload, peak_mib, history_s, window_s, age_s, pods }, or
nil, why ("off", "no data yet", "stale", "unknown") and the workload's name.
]]
function M.peak(req, obj)
    local meta = obj.metadata or {}
    local name = meta.name or meta.generateName or ""
    if obj.kind ~= "Pod" then
        return gg.rightsize(req.namespace, name, obj.kind, name)
    end
    local kind, ref = k8s.owner_kind(obj)
    if kind and type(ref.name) == "string" then
        return gg.rightsize(req.namespace, name, kind, ref.name)
    end
    return gg.rightsize(req.namespace, name)
end

local function ceil_div(a, b)
    return (a + b - 1) // b
end

--[[
The smallest allocation of model that holds memory_milli (bytes x 1000) under sharing mode
mode on pool: { name = "mig-1g.10gb" | "2 whole A100-80GB" | "0.125 of a L4", memory_milli =
what it gives, charge = milli-GPU }, or nil and why when nothing holds it.
]]
function M.allocation(model, mode, pool, memory_milli)
    if mode == "mig" then
        local p, why = gpu.pick_profile(model, { memory_milli = memory_milli })
        if not p then
            return nil, why
        end
        if pool.mig_strategy == "single" then
            local slot = gpu.profile(model, pool.mig_profile)
            if p.memory_milli > slot.memory_milli then
                return nil, string.format("pool %s is split into %s", pool.name, slot.name)
            end
            p = slot
        end
        return { name = "mig-" .. p.name, memory_milli = p.memory_milli, charge = p.charge_milli }
    end
    if mode == "exclusive" then
        local n = math.max(1, ceil_div(memory_milli, model.memory_milli))
        return { name = string.format("%d whole %s", n, model.name), memory_milli = n * model.memory_milli,
            charge = n * 1000 }
    end
    local share = math.max(1, ceil_div(memory_milli * 1000, model.memory_milli))
    if share > 1000 then
        return nil, string.format("a %s share is at most one %s", mode, model.name)
    end
    if (mode == "time-slicing" or mode == "mps") and not intent.isolates(pool) then
        -- A replica there holds one of the GPU's slots, and is charged so (10-gpu-sharing).
        share = math.max(share, ceil_div(1000, pool.replicas or 1))
    end
    return { name = string.format("%s of a %s", quota.format_gpus(share), model.name),
        memory_milli = share * model.memory_milli // 1000, charge = share }
end

--[[
Where memory_milli runs: over candidates (fleet.candidates' { pool, mode } entries, those the
pod's own choice allows), the allocation on the first one that holds it; or, with
cheapest = { max_charge = milli-GPU }, the one of least cost among those charged at most
max_charge: its charge times the pool's cost per GPU (pools[].cost, default 1), the first of
equal cost.  A class without pools of its own (the list's named is false) is routed to its first
candidate alone.  memory_milli may be a function of the pool's model (what a fraction or a whole
GPU asks for there).  The allocation gains pool, mode, cost and asked (the memory held); nil when
none holds it.
]]
function M.placed(cfg, candidates, memory_milli, cheapest)
    local best
    for i, c in ipairs(candidates) do
        if i > 1 and not candidates.named and not cheapest then
            break
        end
        local model = fleet.model(cfg, c.pool)
        local asked = type(memory_milli) == "function" and memory_milli(model) or memory_milli
        local a = M.allocation(model, c.mode, c.pool, asked)
        if a then
            a.pool, a.mode, a.cost, a.asked = c.pool, c.mode, a.charge * (c.pool.cost or 1), asked
            if not cheapest then
                return a
            end
            if a.charge <= cheapest.max_charge and (not best or a.cost < best.cost) then
                best = a
            end
        end
    end
    return best
end

--- The GPU memory an intent entry asks for on model, in milli-bytes: its memory, its fraction
--- of the model's memory, or its whole GPUs, whichever is most (as the sharing policy counts).
function M.asked_memory(e, model)
    local m = e.memory_milli or 0
    if e.fraction_milli then
        m = math.max(m, e.fraction_milli * model.memory_milli // 1000)
    end
    if m == 0 and e.whole then
        m = e.whole * model.memory_milli
    end
    return m
end

--- Peak MiB x headroom rounded up to whole GiB (at least 1 GiB, a guard: the server leaves out
--- workloads whose peak is below 1 GiB, no evidence of a small one), in milli-bytes: what
--- gpu-memory is set to.
function M.needed_memory(peak_mib, headroom)
    local mib = math.max(1, math.ceil(peak_mib * headroom))
    return ceil_div(mib, 1024) * GIB_MILLI
end

--- "7 days", "5 hours", "40 minutes": the span people read in a message.
function M.span(seconds)
    if seconds >= 2 * 86400 then
        return string.format("%d days", seconds // 86400)
    elseif seconds >= 2 * 3600 then
        return string.format("%d hours", seconds // 3600)
    end
    return string.format("%d minutes", seconds // 60)
end

--- "7.1 GiB": MiB with one decimal in GiB.
function M.gib(mib)
    return string.format("%.1f GiB", mib / 1024)
end

M.MIB_MILLI = MIB_MILLI
return M
