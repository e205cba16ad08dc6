--[[
test_quota.lua - tests of lua/quota.lua (GPU-equivalents in integer milli-GPU), run inside the
policy sandbox.

Returns a table mapping test names to functions; a test fails by raising an error.
]]

local gg = require "gpuguard"
local gpu = require "gpu"
local quota = require "quota"
local testlib = require "testlib"

-- Helpers -------------------------------------------------------------------------------------

local eq, raises, json = testlib.eq, testlib.raises, testlib.json

-- The first result of fn(...), or "nil: <message>" when fn returns nil and a message.
local function result(fn, ...)
    local v, err = fn(...)
    if v == nil then
        return "nil: " .. tostring(err)
    end
    return v
end

-- The value parse_fraction gives, or "nil: <message>".
local function parse(s, opts)
    return result(quota.parse_fraction, s, opts)
end

local function c(name, limits, extra)
    local t = { name = name, image = "nvcr.io/nvidia/pytorch:24.05-py3",
                resources = { limits = limits } }
    for k, v in pairs(extra or {}) do
        t[k] = v
    end
    return t
end

local function spec(containers, init)
    return json({ containers = containers, initContainers = init })
end

-- The total pod_charge gives, or "nil: <message>".
local function charge(s, ctx)
    return result(quota.pod_charge, s, ctx)
end

local T = {}

-- Parsing -------------------------------------------------------------------------------------

T["parse_fraction: decimal strings to milli"] = function()
    local cases = {
        ["0.25"] = 250, ["0.5"] = 500, ["1"] = 1000, ["1.0"] = 1000, ["1.000"] = 1000,
        [".5"] = 500, ["0.001"] = 1, ["0.143"] = 143, ["0.250"] = 250, ["0.2500"] = 250,
        ["00.75"] = 750, ["0.1"] = 100, ["0.999"] = 999,
    }
    for s, want in pairs(cases) do
        eq(parse(s), want, s)
    end
    eq(parse(0.25), 250, "a YAML float")
    eq(parse(1), 1000, "a YAML integer")
    eq(parse(0.1), 100, "0.1 as a float is read as its decimal text")
end

T["parse_fraction: clear errors"] = function()
    local cases = {
        { "abc", 'nil: "abc" is not a decimal number; write it like 0.25' },
        { "", 'nil: "" is not a decimal number; write it like 0.25' },
        { "0", 'nil: "0" is not more than 0; ask for a fraction such as 0.25' },
        { "0.000", 'nil: "0.000" is not more than 0; ask for a fraction such as 0.25' },
        { "1.5", 'nil: "1.5" is more than one GPU; ask for a fraction up to 1, or for whole '
          .. "GPUs with nvidia.com/gpu" },
        { "1.001", 'nil: "1.001" is more than one GPU; ask for a fraction up to 1, or for '
          .. "whole GPUs with nvidia.com/gpu" },
        { "0.1234", 'nil: "0.1234" has more than 3 decimals; write 0.123 or 0.124' },
        { "0.0001", 'nil: "0.0001" has more than 3 decimals; write 0.001' },
        { "0.33333", 'nil: "0.33333" has more than 3 decimals; write 0.333 or 0.334' },
        { "-0.5", 'nil: "-0.5" is not a decimal number; write it like 0.25' },
        { "+0.5", 'nil: "+0.5" is not a decimal number; write it like 0.25' },
        { "1e-1", 'nil: "1e-1" is not a decimal number; write it like 0.25' },
        { " 0.5", 'nil: " 0.5" is not a decimal number; write it like 0.25' },
        { "1.", 'nil: "1." is not a decimal number; write it like 0.25' },
        { "50%", 'nil: "50%" is not a decimal number; write it like 0.25' },
        { "0,5", 'nil: "0,5" is not a decimal number; write it like 0.25' },
        { "1\n", 'nil: "1?" is not a decimal number; write it like 0.25' },
        { "1234567890", 'nil: "1234567890" is too large' },
        { string.rep("9", 100), 'nil: "9999999999999999999999999999999999999..." is too long for a GPU amount' },
    }
    for _, cs in ipairs(cases) do
        eq(parse(cs[1]), cs[2], string.format("%q", cs[1]))
    end
    eq(parse(nil), "nil: must be a decimal number such as 0.25, got null", "nil")
    eq(parse(gg.null), "nil: must be a decimal number such as 0.25, got null", "null")
    eq(parse({}), "nil: must be a decimal number such as 0.25, got an object", "table")
end

T["parse_fraction options"] = function()
    local above = { allow_above_one = true }
    eq(parse("1.5", above), 1500, "1.5")
    eq(parse("9.25", above), 9250, "9.25")
    eq(parse("8", above), 8000, "8")
    eq(parse("0", above), 'nil: "0" is not more than 0; ask for a fraction such as 0.25 or a '
       .. "number of GPUs such as 2", "0 above one")
    eq(parse("0", { allow_zero = true }), 0, "zero allowed")
    eq(parse("0.1234", { name = "gpuguard.io/gpu-fraction" }),
       'nil: gpuguard.io/gpu-fraction: "0.1234" has more than 3 decimals; write 0.123 or 0.124',
       "name prefix")
    eq(parse("1.5", { name = "gpuguard.io/gpu-fraction" }),
       'nil: gpuguard.io/gpu-fraction: "1.5" is more than one GPU; ask for a fraction up to 1, '
       .. "or for whole GPUs with nvidia.com/gpu", "name prefix above one")
    raises(function() quota.parse_fraction("0.5", "strict") end,
           "quota.parse_fraction: opts must be a table", "bad opts")
end

T["0.1 + 0.2 == 0.3 exactly in milli"] = function()
    local a, b, c3 = quota.parse_fraction("0.1"), quota.parse_fraction("0.2"),
        quota.parse_fraction("0.3")
    eq(a + b, c3, "0.1 + 0.2")
    eq(quota.format_milli(a + b), "0.3", "formatted")
    eq(0.1 + 0.2 == 0.3, false, "(floats would not)")
    -- Three pods of 0.1, 0.2 and 0.7 fill a quota of 1 exactly (KAI #2209 with floats).
    local used = a + b
    eq(quota.check(used, quota.parse_fraction("0.7"), 1000, "namespace team-a"), true,
       "exactly the quota")
end

-- Formatting ----------------------------------------------------------------------------------

T["format_milli: exact, as few decimals as needed"] = function()
    local cases = {
        [250] = "0.25", [1000] = "1", [9250] = "9.25", [143] = "0.143", [0] = "0", [10] = "0.01",
        [100] = "0.1", [1] = "0.001", [8000] = "8", [8750] = "8.75", [-500] = "-0.5",
        [123456789] = "123456.789", [1001] = "1.001", [2050] = "2.05",
    }
    for m, want in pairs(cases) do
        eq(quota.format_milli(m), want, tostring(m))
    end
    raises(function() quota.format_milli(0.25) end,
           "quota.format_milli: m must be an integer in milli-GPU, got the float 0.25", "float")
    raises(function() quota.format_milli("250") end, "got a string", "string")
end

T["format_gpus: whole numbers bare, fractions with 2 or 3 decimals"] = function()
    local cases = {
        [500] = "0.50", [8000] = "8", [9250] = "9.25", [143] = "0.143", [1100] = "1.10",
        [0] = "0", [10] = "0.01", [100] = "0.10", [1000] = "1", [1001] = "1.001", [-250] = "-0.25",
    }
    for m, want in pairs(cases) do
        eq(quota.format_gpus(m), want, tostring(m))
    end
end

T["parse and format round-trip"] = function()
    for m = 1, 1000 do
        eq(quota.parse_fraction(quota.format_milli(m)), m, "format_milli " .. m)
        eq(quota.parse_fraction(quota.format_gpus(m)), m, "format_gpus " .. m)
    end
    for _, m in ipairs({ 1001, 1500, 9250, 64000, 999999999999 }) do
        eq(quota.parse_fraction(quota.format_milli(m), { allow_above_one = true }), m,
           "above one " .. m)
    end
end

-- Checks --------------------------------------------------------------------------------------

T["check: below and exactly at the limit pass"] = function()
    eq(quota.check(0, 1000, 8000, "namespace team-a"), true, "empty")
    eq(quota.check(7000, 500, 8000, "namespace team-a"), true, "below")
    eq(quota.check(7500, 500, 8000, "namespace team-a"), true, "exactly at the limit")
    eq(quota.check(7857, 143, 8000, "namespace team-a"), true, "a MIG slice to the limit")
    eq(quota.check(123456, 1000, nil, "namespace team-a"), true, "no quota")
    eq(quota.check(9000, 0, 8000, "namespace team-a"), true, "a pod charged nothing")
end

T["check: the message above the limit"] = function()
    -- { used, pod, quota, scope, message, what }
    local cases = {
        { 8750, 500, 8000, "namespace team-a", "namespace team-a would use 9.25 of 8 GPUs (in use "
          .. "8.75, this pod 0.50); ask for a smaller fraction or free GPUs", "message" },
        { 7501, 500, 8000, "namespace team-a", "namespace team-a would use 8.001 of 8 GPUs (in "
          .. "use 7.501, this pod 0.50); ask for a smaller fraction or free GPUs", "one milli over" },
        { 7000, 2000, 8000, "namespace team-a", "namespace team-a would use 9 of 8 GPUs (in use "
          .. "7, this pod 2); ask for fewer GPUs or free GPUs", "whole GPUs" },
        { 900, 143, 1000, "namespace dev", "namespace dev would use 1.043 of 1 GPU (in use 0.90, "
          .. "this pod 0.143); ask for a smaller fraction or free GPUs", "one GPU" },
        { 0, 500, 250, nil, "the namespace would use 0.50 of 0.25 GPUs (in use 0, this pod "
          .. "0.50); this pod alone is over the quota, ask for at most 0.25 GPUs",
          "default scope, pod alone" },
        { 1000, 16000, 8000, "namespace team-a", "namespace team-a would use 17 of 8 GPUs (in use "
          .. "1, this pod 16); this pod alone is over the quota, ask for at most 8 GPUs",
          "pod alone over" },
        { 0, 250, 0, "namespace sandbox", "namespace sandbox has no GPU quota (0 GPUs) and this "
          .. "pod needs 0.25; ask for a GPU quota first", "zero quota" },
        { 9000, 250, 8000, "namespace team-a", "namespace team-a would use 9.25 of 8 GPUs (in use "
          .. "9, this pod 0.25); ask for a smaller fraction or free GPUs", "already over" },
    }
    for _, c in ipairs(cases) do
        local ok, msg = quota.check(c[1], c[2], c[3], c[4])
        eq(ok, false, c[6] .. ": ok")
        eq(msg, c[5], c[6])
    end
end

T["check: only integers"] = function()
    raises(function() quota.check(8.75, 500, 8000) end,
           "quota.check: used_milli must be a non-negative integer in milli-GPU, got the float "
           .. "8.75", "float used")
    raises(function() quota.check(0, "500", 8000) end, "quota.check: charge_milli", "string")
    raises(function() quota.check(0, 500, -1) end, "quota.check: limit_milli", "negative limit")
    raises(function() quota.check(0, 500, 8000, 42) end, "quota.check: scope must be a string",
           "scope")
end

-- Pod charges ---------------------------------------------------------------------------------

T["pod_charge: whole GPUs"] = function()
    local s = spec({ c("trainer", { ["nvidia.com/gpu"] = "2", memory = "64Gi" }),
                     c("logger", { cpu = "100m" }) })
    local total, b = quota.pod_charge(s)
    eq(total, 2000, "total")
    eq(#b, 1, "only GPU containers in the breakdown")
    eq(b[1].container, "trainer", "container")
    eq(b[1].kind, "regular", "kind")
    eq(b[1].charge, 2000, "charge")
    eq(b[1].items[1].rule, "whole GPU", "rule")
    eq(quota.describe(total, b), "2 = trainer 2 x nvidia.com/gpu (1 each)", "describe")
    eq(charge(spec({ c("x", { cpu = "1" }) })), 0, "no GPU")
    eq(charge(nil), 0, "no spec")
end

T["pod_charge: MIG devices (mixed strategy)"] = function()
    local s = spec({ c("a", { ["nvidia.com/mig-1g.10gb"] = "2" }),
                     c("b", { ["nvidia.com/mig-3g.40gb"] = "1" }) })
    eq(charge(s, { model = "A100-80GB" }), 2 * 143 + 429, "A100-80GB")
    local total, b = quota.pod_charge(s, { model = gpu.model("H100-80GB") })
    eq(total, 715, "model table")
    eq(b[1].items[1].each, 143, "each")
    eq(b[1].items[1].rule, "MIG 1g.10gb on H100-80GB", "rule")
    eq(quota.describe(total, b), "0.715 = a 2 x nvidia.com/mig-1g.10gb (0.143 each); "
       .. "b 1 x nvidia.com/mig-3g.40gb (0.429 each)", "describe")
    eq(charge(spec({ c("a", { ["nvidia.com/mig-2g.12gb"] = "1" }) }), { model = "A30" }), 500,
       "A30 2g")
    eq(charge(spec({ c("a", { ["nvidia.com/mig-4g.24gb"] = "1" }) }), { model = "A30" }), 1000,
       "A30 4g")
    eq(charge(spec({ c("a", { ["nvidia.com/mig-1g.10gb.me"] = "1" }) }), { model = "A100-80GB" }),
       143, "+me")
end

T["pod_charge: MIG needs the model and a profile it has"] = function()
    local s = spec({ c("a", { ["nvidia.com/mig-1g.5gb"] = "1" }) })
    eq(charge(s), 'nil: container "a": nvidia.com/mig-1g.5gb needs the GPU model to be charged: '
       .. "give ctx.model", "no model")
    eq(charge(s, { model = "A100-80GB" }), 'nil: container "a": nvidia.com/mig-1g.5gb: GPU model '
       .. 'A100-80GB has no MIG profile "1g.5gb"; its profiles are 1g.10gb, 1g.10gb+me, 1g.20gb, '
       .. "2g.20gb, 3g.40gb, 4g.40gb, 7g.80gb", "wrong model")
    eq(charge(s, { model = "A100-40GB" }), 143, "right model")
    eq(charge(s, { model = "A100" }), 'nil: GPU model "A100" is ambiguous: it may be A100-40GB '
       .. "or A100-80GB; name the memory size, such as A100-80GB", "ambiguous model")
end

T["pod_charge: MIG single strategy (nvidia.com/gpu is a MIG device)"] = function()
    local s = spec({ c("a", { ["nvidia.com/gpu"] = "2" }) })
    eq(charge(s, { gpu_means = "mig", model = "A100-80GB", profile = "1g.10gb" }), 286, "2 x 1g")
    eq(charge(s, { gpu_means = "mig", model = "A100-80GB" }), 'nil: container "a": '
       .. "nvidia.com/gpu is a MIG device (single strategy), but its profile is not known: give "
       .. "ctx.profile", "no profile")
    eq(charge(s, { gpu_means = "mig", profile = "1g.10gb" }), 'nil: container "a": '
       .. "nvidia.com/gpu (MIG single) needs the GPU model to be charged: give ctx.model",
       "no model")
end

T["pod_charge: shared replicas"] = function()
    local s = spec({ c("a", { ["nvidia.com/gpu.shared"] = "1" }) })
    eq(charge(s, { replicas = 4 }), 250, "1 of 4 replicas")
    eq(charge(s, { replicas = 3 }), 334, "1 of 3 replicas, rounded up")
    eq(charge(s, { replica_milli = 100 }), 100, "a given fraction")
    eq(charge(s), 'nil: container "a": nvidia.com/gpu.shared is a shared replica, but the '
       .. "charge of a replica is not known: give ctx.replicas or ctx.replica_milli", "unknown")
    local ts = spec({ c("a", { ["nvidia.com/gpu"] = "1" }) })
    eq(charge(ts, { gpu_means = "replica", replicas = 10 }), 100, "time-slicing, not renamed")
    local mig = spec({ c("a", { ["nvidia.com/mig-1g.10gb.shared"] = "1" }) })
    eq(charge(mig, { model = "A100-80GB", replicas = 2 }), 72, "half of a 1g (143 / 2)")
    eq(charge(mig, { model = "A100-80GB", replica_milli = 500 }), 72, "same by fraction")
end

T["pod_charge: HAMi vGPU shares"] = function()
    local A100 = { model = "A100-80GB" }
    eq(charge(spec({ c("a", { ["nvidia.com/gpu"] = "1", ["nvidia.com/gpumem"] = "20480" }) }),
              A100), 250, "a quarter of the memory")
    eq(charge(spec({ c("a", { ["nvidia.com/gpu"] = "2", ["nvidia.com/gpumem"] = "20000",
                              ["nvidia.com/gpucores"] = "30" }) }), A100), 600,
       "2 GPUs x max(245, 300)")
    eq(charge(spec({ c("a", { ["nvidia.com/gpumem"] = "8192" }) }), A100), 100,
       "nvidia.com/gpu defaults to 1")
    eq(charge(spec({ c("a", { ["nvidia.com/gpu"] = "1", ["nvidia.com/gpucores"] = "20" }) })),
       1000, "cores only: all the memory")
    eq(charge(spec({ c("a", { ["nvidia.com/gpumem-percentage"] = "25" }) })), 250, "percentage")
    eq(charge(spec({ c("a", { ["nvidia.com/gpumem"] = "8000" }) })), 'nil: container "a": '
       .. "nvidia.com/gpumem needs the GPU model to be charged: give ctx.model", "no model")
    eq(charge(spec({ c("a", { ["nvidia.com/gpucores"] = "150" }) })), 'nil: container "a": '
       .. "nvidia.com/gpucores = 150 must be a percentage from 0 to 100", "cores over 100")
end

T["pod_charge: Volcano vGPU shares"] = function()
    eq(charge(spec({ c("a", { ["volcano.sh/vgpu-number"] = "2",
                              ["volcano.sh/vgpu-memory"] = "12288" }) }), { model = "L4" }), 1000,
       "2 x half an L4")
    eq(charge(spec({ c("a", { ["volcano.sh/vgpu-cores"] = "50",
                              ["volcano.sh/vgpu-memory-percentage"] = "10" }) })), 500,
       "cores win")
end

T["pod_charge: init containers and sidecars as the scheduler counts"] = function()
    local G = "nvidia.com/gpu"
    -- An init container that uses 2 GPUs before one that uses 1: max(2, 1) = 2.
    eq(charge(spec({ c("main", { [G] = "1" }) }, { c("warmup", { [G] = "2" }) })), 2000,
       "init larger")
    eq(charge(spec({ c("main", { [G] = "3" }) }, { c("warmup", { [G] = "2" }) })), 3000,
       "regular larger")
    -- A sidecar runs beside everything: 1 + 1 = 2, and the init after it sees it: 1 + 1.
    local s = spec({ c("main", { [G] = "1" }) },
                   { c("proxy", { [G] = "1" }, { restartPolicy = "Always" }),
                     c("warmup", { [G] = "1" }) })
    local total, b = quota.pod_charge(s)
    eq(total, 2000, "sidecar")
    eq(b[1].kind, "sidecar", "sidecar kind")
    eq(b[2].kind, "init", "init kind")
    eq(b[3].kind, "regular", "regular kind")
    -- Ephemeral containers do not count.
    local e = spec({ c("main", { [G] = "1" }) })
    e.ephemeralContainers = json({ c("debug", { [G] = "1" }) })
    eq(charge(e), 1000, "ephemeral")
end

T["pod_charge: a fraction annotation is charged to the pod"] = function()
    local s = spec({ c("notebook", { cpu = "2" }) })
    local total, b = quota.pod_charge(s, { fraction_milli = 250 })
    eq(total, 250, "0.25")
    eq(b[1].kind, "pod", "kind")
    eq(quota.describe(total, b), "0.25 = pod 1 x gpu-fraction (0.25 each)", "describe")
    eq(charge(s, { fraction_milli = 500, fraction_devices = 2 }), 1000, "2 devices")
    eq(charge(s, { fraction_milli = quota.parse_fraction("0.1") })
       + charge(s, { fraction_milli = quota.parse_fraction("0.2") }), 300, "0.1 + 0.2")
end

T["pod_charge: a mixed pod adds up in one unit"] = function()
    local s = spec({
        c("trainer", { ["nvidia.com/gpu"] = "1" }),
        c("embedder", { ["nvidia.com/mig-2g.20gb"] = "1" }),
        c("tokenizer", { ["nvidia.com/gpu.shared"] = "1" }),
    })
    local total, b = quota.pod_charge(s, { model = "H100-80GB", replicas = 8 })
    eq(total, 1000 + 286 + 125, "total")
    eq(#b, 3, "entries")
    eq(quota.check(6589, total, 8000, "namespace team-a"), true, "fits exactly")
    local ok, msg = quota.check(6590, total, 8000, "namespace team-a")
    eq(ok, false, "one milli over")
    eq(msg, "namespace team-a would use 8.001 of 8 GPUs (in use 6.59, this pod 1.411); ask for "
       .. "a smaller fraction or free GPUs", "message")
end

T["pod_charge: malformed ctx raises"] = function()
    local s = spec({ c("a", { ["nvidia.com/gpu"] = "1" }) })
    raises(function() quota.pod_charge(s, { gpu_means = "exclusive" }) end,
           'quota.pod_charge: ctx.gpu_means must be "whole", "mig" or "replica", got "exclusive"',
           "gpu_means")
    raises(function() quota.pod_charge(s, { replicas = 0 }) end, "ctx.replicas", "replicas")
    raises(function() quota.pod_charge(s, { replica_milli = 0.5 }) end, "ctx.replica_milli",
           "replica_milli")
    raises(function() quota.pod_charge(s, { fraction_milli = 0.25 }) end,
           "ctx.fraction_milli must be an integer from 0 to 1000, got the float 0.25", "fraction")
    raises(function() quota.pod_charge(s, "A100") end, "quota.pod_charge: ctx must be a table",
           "ctx")
    raises(function() quota.describe(1.5, {}) end, "quota.describe", "describe")
    raises(function() quota.pod_charge(s, { requested = "yes" }) end,
           "ctx.requested must be a table or nil, got a string", "requested")
end

T["pod_charge: ctx.requested keeps each container's GPU resources across calls"] = function()
    local s = spec({ c("trainer", { ["nvidia.com/gpu.shared"] = "2" }), c("logger", { cpu = "1" }) })
    local kept = {}
    eq(quota.pod_charge(s, { replicas = 4, requested = kept }), 500, "replicas 4")
    local trainer, logger = s.containers[1], s.containers[2]
    eq(kept[trainer][1].resource, "nvidia.com/gpu.shared", "trainer's answer kept")
    eq(kept[trainer][1].count, 2, "its count")
    eq(#kept[logger], 0, "logger's: no GPU resource")
    eq(quota.pod_charge(s, { replica_milli = 1, requested = kept }), 2, "same answers, other ctx")
    -- What is kept is what counts: a call with it does not read the container again.
    kept[trainer] = { { resource = "nvidia.com/gpu", count = 3, kind = "whole", unit = "devices" } }
    eq(quota.pod_charge(s, { requested = kept }), 3000, "kept answer used")
    eq(quota.pod_charge(s, { replicas = 2 }), 1000, "without it, read afresh")
end

return T
