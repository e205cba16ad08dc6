--[[
quota.lua - GPU quotas in GPU-equivalents, as integer milli-GPU.

A whole GPU is 1000, a MIG device its compute fraction of the GPU (gpu.charge_milli: 1g of 7 =
143), a shared replica the fraction it stands for.  This module parses and prints those
numbers exactly (no floating point anywhere: "0.1" + "0.2" is exactly "0.3"), computes the
charge of a pod from the GPU resources its containers ask for, and checks a charge against a
quota with a message that says what to change.  See lua/README.md for the full reference.

Conventions:
  * Amounts are Lua integers in milli-GPU; passing a float is an error.
  * Functions that judge data (a user's fraction, a pod) return nil/false and a message;
    wrong argument types raise an error naming the function.
Must not: keep state between calls, or write into the tables it is given.
]]

local k8s = require "k8s"
local gpu = require "gpu"
local args = require "args"

local M = {}

-- Internal helpers ---------------------------------------------------------------------------

local fail = args.failer("quota")
local what, show = args.what, args.show

local INIT_AND_REGULAR = { init = true, regular = true } -- k8s.containers' opts, only read

local function check_milli(lvl, fname, name, v, allow_nil)
    if v == nil and allow_nil then
        return
    end
    if math.type(v) ~= "integer" or v < 0 then
        fail(lvl + 1, fname, "%s must be a non-negative integer in milli-GPU, got %s", name,
             what(v))
    end
end

local function ceil_div(a, b)
    return (a + b - 1) // b
end

-- Numbers -------------------------------------------------------------------------------------

-- m (milli-GPU) as "<sign><whole>" when whole, else "<sign><whole>.<three decimals>" less what
-- the pattern trim matches.
local function format(lvl, fname, m, trim)
    if math.type(m) ~= "integer" then
        fail(lvl + 1, fname, "m must be an integer in milli-GPU, got %s", what(m))
    end
    local sign = m < 0 and "-" or ""
    local a = m < 0 and -m or m
    if a % 1000 == 0 then
        return sign .. (a // 1000)
    end
    return sign .. (string.format("%d.%03d", a // 1000, a % 1000):gsub(trim, ""))
end

--- Format milli-GPU exactly, with as few decimals as needed: 250 -> "0.25", 1000 -> "1",
--- 9250 -> "9.25", 143 -> "0.143", -500 -> "-0.5".
function M.format_milli(m)
    return (format(2, "format_milli", m, "0+$"))
end

--- Format milli-GPU for messages: whole numbers without decimals, fractional ones with at least
--- two decimals and at most three (exact): 8000 -> "8", 500 -> "0.50", 9250 -> "9.25",
--- 143 -> "0.143", 1100 -> "1.10".
function M.format_gpus(m)
    return (format(2, "format_gpus", m, "0$"))
end

local MAX_WHOLE_DIGITS = 9 -- up to 999999999 GPUs: far below integer overflow in milli

--- Parse a decimal GPU amount into milli-GPU: "0.25" -> 250, "1" -> 1000, ".5" -> 500,
--- "0.250" -> 250; numbers (from YAML) are read as their decimal text.  At most three decimals
--- (more are accepted only when they are zeros).  By default the value must be more than 0 and
--- at most 1; opts = { allow_above_one = true, allow_zero = true, name = "gpuguard.io/
--- gpu-fraction" } relaxes that and prefixes messages with the name.  Returns the integer, or
--- nil and a message: "\"0.1234\" has more than 3 decimals; write 0.123 or 0.124".
function M.parse_fraction(s, opts)
    opts = opts or {}
    if type(opts) ~= "table" then
        fail(2, "parse_fraction", "opts must be a table, got %s", what(opts))
    end
    local prefix = opts.name and tostring(opts.name) .. ": " or ""
    local function bad(fmt, ...)
        return nil, prefix .. string.format(fmt, ...)
    end
    if math.type(s) == "integer" then
        s = tostring(s)
    elseif math.type(s) == "float" then
        s = string.format("%.14g", s)
    elseif type(s) ~= "string" then
        return bad("must be a decimal number such as 0.25, got %s", what(s))
    end
    if #s > 40 then
        return bad("%s is too long for a GPU amount", show(s))
    end
    local whole, frac = s:match("^(%d+)%.(%d+)$")
    if not whole then
        whole, frac = s:match("^(%d+)$"), ""
        if not whole then
            whole, frac = "0", s:match("^%.(%d+)$")
        end
    end
    if not frac then
        return bad("%s is not a decimal number; write it like 0.25", show(s))
    end
    whole = whole:gsub("^0+", "")
    if #whole > MAX_WHOLE_DIGITS then
        return bad("%s is too large", show(s))
    end
    if #frac > 3 then
        if not frac:sub(4):match("^0+$") then
            local down = tonumber(whole == "" and "0" or whole) * 1000 + tonumber(frac:sub(1, 3))
            local alts = down > 0 and M.format_milli(down) .. " or " .. M.format_milli(down + 1)
                or M.format_milli(down + 1)
            return bad("%s has more than 3 decimals; write %s", show(s), alts)
        end
        frac = frac:sub(1, 3)
    end
    local m = tonumber(whole == "" and "0" or whole) * 1000 + tonumber((frac .. "000"):sub(1, 3))
    if m == 0 and not opts.allow_zero then
        return bad("%s is not more than 0; ask for a fraction such as 0.25%s", show(s),
                   opts.allow_above_one and " or a number of GPUs such as 2" or "")
    elseif m > 1000 and not opts.allow_above_one then
        return bad("%s is more than one GPU; ask for a fraction up to 1, or for whole GPUs "
                   .. "with nvidia.com/gpu", show(s))
    end
    return m
end

-- Pod charges ---------------------------------------------------------------------------------

-- The charge of one shared replica of a device worth base milli-GPU in container name, or nil
-- and a message.
local function replica_charge(ctx, base, what_for, name)
    local own = ctx.replica_milli_in and ctx.replica_milli_in[name]
    if own ~= nil then
        return ceil_div(base * own, 1000)
    elseif ctx.replicas ~= nil then
        return ceil_div(base, ctx.replicas)
    elseif ctx.replica_milli ~= nil then
        return ceil_div(base * ctx.replica_milli, 1000)
    end
    return nil, string.format("%s is a shared replica, but the charge of a replica is not "
                              .. "known: give ctx.replicas or ctx.replica_milli", what_for)
end

local function check_ctx(lvl, ctx)
    if type(ctx) ~= "table" then
        fail(lvl + 1, "pod_charge", "ctx must be a table or nil, got %s", what(ctx))
    end
    local means = ctx.gpu_means
    if means ~= nil and means ~= "whole" and means ~= "mig" and means ~= "replica" then
        fail(lvl + 1, "pod_charge", "ctx.gpu_means must be \"whole\", \"mig\" or \"replica\", "
             .. "got %s", show(means))
    end
    if ctx.replicas ~= nil and (math.type(ctx.replicas) ~= "integer" or ctx.replicas < 1) then
        fail(lvl + 1, "pod_charge", "ctx.replicas must be a positive integer, got %s",
             what(ctx.replicas))
    end
    if ctx.replica_milli ~= nil and (math.type(ctx.replica_milli) ~= "integer"
        or ctx.replica_milli < 1 or ctx.replica_milli > 1000) then
        fail(lvl + 1, "pod_charge", "ctx.replica_milli must be an integer from 1 to 1000, "
             .. "got %s", what(ctx.replica_milli))
    end
    for name, milli in pairs(ctx.replica_milli_in or {}) do
        if type(name) ~= "string" or math.type(milli) ~= "integer" or milli < 1 or milli > 1000 then
            fail(lvl + 1, "pod_charge", "ctx.replica_milli_in must map container names to integers "
                 .. "from 1 to 1000, got %s = %s", what(name), what(milli))
        end
    end
    if ctx.fraction_milli ~= nil and (math.type(ctx.fraction_milli) ~= "integer"
        or ctx.fraction_milli < 0 or ctx.fraction_milli > 1000) then
        fail(lvl + 1, "pod_charge", "ctx.fraction_milli must be an integer from 0 to 1000, "
             .. "got %s", what(ctx.fraction_milli))
    end
    if ctx.memory_mib ~= nil and (math.type(ctx.memory_mib) ~= "integer" or ctx.memory_mib < 1) then
        fail(lvl + 1, "pod_charge", "ctx.memory_mib must be a positive integer, got %s",
             what(ctx.memory_mib))
    end
    if ctx.fraction_devices ~= nil and (math.type(ctx.fraction_devices) ~= "integer"
        or ctx.fraction_devices < 1) then
        fail(lvl + 1, "pod_charge", "ctx.fraction_devices must be a positive integer, got %s",
             what(ctx.fraction_devices))
    end
    if ctx.requested ~= nil and type(ctx.requested) ~= "table" then
        fail(lvl + 1, "pod_charge", "ctx.requested must be a table or nil, got %s",
             what(ctx.requested))
    end
end

-- The model of ctx (resolved once), or nil and a message saying what needed it.
local function ctx_model(ctx, state, needed_for)
    if state.model then
        return state.model
    end
    if ctx.model == nil then
        return nil, string.format("%s needs the GPU model to be charged: give ctx.model",
                                  needed_for)
    end
    local m, err = ctx.model, nil
    if type(m) == "string" then
        m, err = gpu.model(m, ctx.catalog)
        if not m then
            return nil, err
        end
    end
    state.model = m
    return m
end

-- The GPU memory (MiB) a memory request is a share of: ctx.memory_mib, else the model's.
local function memory_mib(ctx, state, needed_for)
    if ctx.memory_mib then
        return ctx.memory_mib
    end
    local m, err = ctx_model(ctx, state, needed_for)
    return m and m.memory_mib, err
end

-- Per GPU share (milli) of a memory/cores request of a HAMi or Volcano vGPU: the larger of
-- the memory share (MiB of the model's memory, or a percentage; the whole memory when neither
-- is given, as both backends default) and the cores percentage; at most 1000.
local function vgpu_share(ctx, state, who, mem_item, pct_item, cores_item)
    local share = 1000
    if mem_item then
        local mib, err = memory_mib(ctx, state, who .. " " .. mem_item.resource)
        if not mib then
            return nil, err
        end
        share = ceil_div(mem_item.count * 1000, mib)
    elseif pct_item then
        if pct_item.count > 100 then
            return nil, string.format("%s %s = %d must be a percentage from 0 to 100", who,
                                      pct_item.resource, pct_item.count)
        end
        share = pct_item.count * 10
    end
    if cores_item then
        if cores_item.count > 100 then
            return nil, string.format("%s %s = %d must be a percentage from 0 to 100", who,
                                      cores_item.resource, cores_item.count)
        end
        share = math.max(share, cores_item.count * 10)
    end
    return math.min(share, 1000)
end

-- The charge lines of the GPU resources items (gpu.requested) of the container named name: list
-- of {resource, count, charge, rule, class (a DRA extended resource's device class)}, or nil, msg.
local function container_lines(items, name, ctx, state)
    local who = string.format("container %q:", name)
    local by = {}
    for _, it in ipairs(items) do
        by[it.resource] = it
    end
    local lines = {}
    local function add(it, count, per, rule)
        lines[#lines + 1] = { resource = it.resource, count = count, charge = count * per,
                              each = per, rule = rule, class = it.class }
    end
    local whole = by["nvidia.com/gpu"]

    -- HAMi: nvidia.com/gpu counts physical GPUs, each shared by gpumem/gpucores (default 1).
    local h_mem, h_pct = by["nvidia.com/gpumem"], by["nvidia.com/gpumem-percentage"]
    local h_cores = by["nvidia.com/gpucores"]
    if h_mem or h_pct or h_cores then
        local per, err = vgpu_share(ctx, state, who, h_mem, h_pct, h_cores)
        if not per then
            return nil, err
        end
        local n = whole and whole.count or 1
        add(whole or { resource = "nvidia.com/gpu" }, n, per, "HAMi vGPU")
        whole = nil
    end

    -- Volcano vGPU: volcano.sh/vgpu-number vGPUs, each sharing one GPU (default 1).
    local v_num, v_mem = by["volcano.sh/vgpu-number"], by["volcano.sh/vgpu-memory"]
    local v_pct, v_cores = by["volcano.sh/vgpu-memory-percentage"], by["volcano.sh/vgpu-cores"]
    if v_num or v_mem or v_pct or v_cores then
        local per, err = vgpu_share(ctx, state, who, v_mem, v_pct, v_cores)
        if not per then
            return nil, err
        end
        add(v_num or { resource = "volcano.sh/vgpu-number" }, v_num and v_num.count or 1, per,
            "Volcano vGPU")
    end
    -- Legacy Volcano gpushare: gpu-number whole GPUs, gpu-memory MiB of one shared GPU.
    if by["volcano.sh/gpu-number"] then
        add(by["volcano.sh/gpu-number"], by["volcano.sh/gpu-number"].count, 1000, "whole GPU")
    end
    if by["volcano.sh/gpu-memory"] then
        local it = by["volcano.sh/gpu-memory"]
        local mib, err = memory_mib(ctx, state, who .. " " .. it.resource)
        if not mib then
            return nil, err
        end
        add(it, 1, math.min(1000, ceil_div(it.count * 1000, mib)), "Volcano gpushare")
    end

    for _, it in ipairs(items) do
        if it == whole then
            local means = ctx.gpu_means or "whole"
            if means == "whole" then
                add(it, it.count, 1000, "whole GPU")
            elseif means == "mig" then
                local m, err = ctx_model(ctx, state, who .. " nvidia.com/gpu (MIG single)")
                if not m then
                    return nil, err
                end
                if ctx.profile == nil then
                    return nil, who .. " nvidia.com/gpu is a MIG device (single strategy), but "
                        .. "its profile is not known: give ctx.profile"
                end
                local per
                per, err = gpu.charge_milli(m, ctx.profile)
                if not per then
                    return nil, err
                end
                add(it, it.count, per, "MIG " .. tostring(ctx.profile) .. " on " .. m.name)
            else
                local per, err = replica_charge(ctx, 1000, who .. " nvidia.com/gpu", name)
                if not per then
                    return nil, err
                end
                add(it, it.count, per, "shared replica")
            end
        elseif it.kind == "mig" or (it.kind == "shared" and it.profile) then
            local m, err = ctx_model(ctx, state, who .. " " .. it.resource)
            if not m then
                return nil, err
            end
            local per
            per, err = gpu.charge_milli(m, it.profile)
            if not per then
                return nil, who .. " " .. it.resource .. ": " .. err
            end
            if it.kind == "shared" then
                per, err = replica_charge(ctx, per, who .. " " .. it.resource, name)
                if not per then
                    return nil, err
                end
                add(it, it.count, per, "shared replica of MIG " .. it.profile .. " on " .. m.name)
            else
                add(it, it.count, per, "MIG " .. it.profile .. " on " .. m.name)
            end
        elseif it.kind == "shared" then
            local per, err = replica_charge(ctx, 1000, who .. " " .. it.resource, name)
            if not per then
                return nil, err
            end
            add(it, it.count, per, "shared replica")
        elseif it.kind == "dra" then
            -- Any device of the class: a MIG device is a whole GPU at most, and no selector
            -- can narrow an extended resource down to a profile.
            add(it, it.count, 1000, "DRA device class")
        end
    end
    return lines
end

--- The charge of a pod in milli-GPU from the GPU resources its containers ask for, and a
--- breakdown.  Rules (see lua/README.md):
---   nvidia.com/gpu                  1000 each (ctx.gpu_means "whole", the default); a MIG device
---                                   of ctx.profile when "mig" (single strategy); a replica when
---                                   "replica" (time-slicing/MPS without renaming)
---   nvidia.com/mig-<p>              gpu.charge_milli(ctx.model, p) each
---   nvidia.com/gpu.shared           a replica each: ceil(1000 / ctx.replicas), or
---                                   ceil(1000 * ctx.replica_milli / 1000)
---   nvidia.com/mig-<p>.shared       a replica of the MIG device: ceil(charge(p) / replicas)
---   HAMi gpumem/-percentage/cores   per GPU max(memory share, cores share), memory share =
---                                   ceil(MiB * 1000 / GPU MiB) (all of it when not given;
---                                   GPU MiB is ctx.memory_mib, else the model's);
---                                   times nvidia.com/gpu (default 1).  Volcano vgpu-* alike.
---   ctx.fraction_milli              a fraction annotation (KAI style), times
---                                   ctx.fraction_devices (default 1), charged to the pod
--- ctx.requested (optional): a table in which each container's gpu.requested answer is kept,
--- for several calls on a spec that does not change between them (the answers are only read).
--- Containers combine as the scheduler combines requests: max(sum of regular and sidecar
--- containers, each init container plus the sidecars started before it); ephemeral containers
--- do not count.  Returns total, breakdown where breakdown is a list of
---   { container = name, kind = "regular"|"init"|"sidecar"|"pod", charge = milli,
---     items = { { resource, count, each, charge, rule, class } } }  (class: a DRA extended
---     resource's device class, nil otherwise)
--- (containers without GPU resources left out), or nil and a message naming the container
--- and what is missing (an unknown profile, no model for a MIG resource, ...).
function M.pod_charge(pod_spec, ctx)
    ctx = ctx or {}
    check_ctx(2, ctx)
    local state = {}
    local breakdown = {}
    local sum, init_max, sidecars = 0, 0, 0
    local requested = ctx.requested
    for c, kind in k8s.containers(pod_spec, INIT_AND_REGULAR) do
        local items = requested and requested[c]
        if not items then
            items = gpu.requested(c)
            if requested then
                requested[c] = items
            end
        end
        local charge, name, lines = 0, nil, nil
        if #items > 0 then -- most containers ask for no GPU: no name, lines or messages for them
            name = c.name
            if type(name) ~= "string" then
                name = "?"
            end
            local err
            lines, err = container_lines(items, name, ctx, state)
            if not lines then
                return nil, err
            end
            for _, l in ipairs(lines) do
                charge = charge + l.charge
            end
        end
        local sidecar = kind == "init" and k8s.is_sidecar(c, kind)
        if kind == "regular" then
            sum = sum + charge
        elseif sidecar then
            sum, sidecars = sum + charge, sidecars + charge
            init_max = math.max(init_max, sidecars)
        else
            init_max = math.max(init_max, charge + sidecars)
        end
        if lines and #lines > 0 then
            breakdown[#breakdown + 1] = {
                container = name,
                kind = sidecar and "sidecar" or kind,
                charge = charge,
                items = lines,
            }
        end
    end
    local total = math.max(sum, init_max)
    if ctx.fraction_milli and ctx.fraction_milli > 0 then
        local n = ctx.fraction_devices or 1
        local charge = ctx.fraction_milli * n
        breakdown[#breakdown + 1] = {
            kind = "pod",
            charge = charge,
            items = { { resource = "gpu-fraction", count = n, each = ctx.fraction_milli,
                        charge = charge, rule = "fraction" } },
        }
        total = total + charge
    end
    return total, breakdown
end

--- A one-line account of a pod charge for an annotation or a message:
--- "0.286 = trainer 2 x nvidia.com/mig-1g.10gb (0.143 each)" ("; "-separated per container).
function M.describe(total, breakdown)
    if math.type(total) ~= "integer" or type(breakdown) ~= "table" then
        fail(2, "describe", "give the two results of quota.pod_charge")
    end
    local parts = {}
    for _, b in ipairs(breakdown) do
        local items = {}
        for _, it in ipairs(b.items) do
            items[#items + 1] = string.format("%d x %s (%s each)", it.count, it.resource,
                                              M.format_milli(it.each))
        end
        parts[#parts + 1] = (b.container and b.container .. " " or "pod ")
            .. table.concat(items, " + ")
    end
    if #parts == 0 then
        return M.format_milli(total)
    end
    return M.format_milli(total) .. " = " .. table.concat(parts, "; ")
end

-- Checks --------------------------------------------------------------------------------------

local function gpus_word(m)
    return m == 1000 and "GPU" or "GPUs"
end

--- Check a charge against a quota: used_milli already in use, charge_milli this pod,
--- limit_milli the quota (nil: no quota).  Exactly at the limit is allowed, and so is a pod
--- that is charged nothing (even when the scope is already over its quota).  Returns true, or
--- false and a message (the caller prefixes the policy name):
---   "namespace team-a would use 9.25 of 8 GPUs (in use 8.75, this pod 0.50); ask for a
---    smaller fraction or free GPUs"
--- scope names who holds the quota ("namespace team-a", the default "the namespace").  Numbers
--- are shown with quota.format_gpus.
function M.check(used_milli, charge_milli, limit_milli, scope)
    check_milli(2, "check", "used_milli", used_milli)
    check_milli(2, "check", "charge_milli", charge_milli)
    check_milli(2, "check", "limit_milli", limit_milli, true)
    if scope ~= nil and type(scope) ~= "string" then
        fail(2, "check", "scope must be a string such as \"namespace team-a\", got %s",
             what(scope))
    end
    scope = scope or "the namespace"
    if limit_milli == nil or charge_milli == 0 or used_milli + charge_milli <= limit_milli then
        return true
    end
    local f = M.format_gpus
    if limit_milli == 0 then
        return false, string.format("%s has no GPU quota (0 GPUs) and this pod needs %s; ask "
                                    .. "for a GPU quota first", scope, f(charge_milli))
    end
    local advice
    if charge_milli > limit_milli then
        advice = string.format("this pod alone is over the quota, ask for at most %s %s",
                               f(limit_milli), gpus_word(limit_milli))
    elseif charge_milli % 1000 == 0 then
        advice = "ask for fewer GPUs or free GPUs"
    else
        advice = "ask for a smaller fraction or free GPUs"
    end
    return false, string.format("%s would use %s of %s %s (in use %s, this pod %s); %s", scope,
                                f(used_milli + charge_milli), f(limit_milli),
                                gpus_word(limit_milli), f(used_milli), f(charge_milli), advice)
end

return M
