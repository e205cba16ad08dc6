--[[
test_rightsize.lua - tests of lua/rightsize.lua (the allocation that holds a workload's peak GPU
memory x headroom, the settings and their checks), run inside the policy sandbox.

Returns a table mapping test names to functions; a test fails by raising an error.
]]

local gpu = require "gpu"
local rightsize = require "rightsize"
local fleet = require "fleet"
local testlib = require "testlib"

local eq, raises = testlib.eq, testlib.raises

local GIB = 1024 * 1024 * 1024 * 1000 -- milli-bytes

local T = {}

-- Peak MiB x headroom, rounded up to whole GiB, then the smallest allocation of each mode.
function T.profile_choice()
    local a100 = assert(gpu.model("A100-80GB"))
    local mixed = { name = "a100-mig", mig_strategy = "mixed" }
    local cases = {
        -- peak MiB, headroom, needed GiB, allocation
        { 7270, 1.25, 9, "mig-1g.10gb" },   -- 9087.5 MiB
        { 8192, 1.25, 10, "mig-1g.10gb" },  -- exactly 10 GiB fits the 10 GB slice
        { 8193, 1.25, 11, "mig-1g.20gb" },  -- one MiB more needs the next memory size
        { 15000, 1.25, 19, "mig-1g.20gb" },
        { 30000, 1.25, 37, "mig-3g.40gb" },
        { 60000, 1.25, 74, "mig-7g.80gb" },
        { 100, 1, 1, "mig-1g.10gb" },
        { 0, 1.25, 1, "mig-1g.10gb" },      -- an idle GPU still gets 1 GiB, never 0
    }
    for _, c in ipairs(cases) do
        local need = rightsize.needed_memory(c[1], c[2])
        eq(need, c[3] * GIB, c[1] .. " MiB x " .. c[2])
        local got = assert(rightsize.allocation(a100, "mig", mixed, need))
        eq(got.name, c[4], c[1] .. " MiB on MIG")
    end
    local none, why = rightsize.allocation(a100, "mig", mixed, 81 * GIB)
    eq(none, nil, "81 GiB on an 80 GB GPU")
    eq(why ~= nil, true, "why nothing fits")
end

function T.single_strategy_gives_the_pools_slot()
    local a100 = assert(gpu.model("A100-80GB"))
    local single = { name = "a100-3g", mig_strategy = "single", mig_profile = "3g.40gb" }
    eq(rightsize.allocation(a100, "mig", single, 9 * GIB).name, "mig-3g.40gb", "9 GiB")
    local none, why = rightsize.allocation(a100, "mig", single, 41 * GIB)
    eq(none, nil, "41 GiB in 3g.40gb slots")
    eq(why, "pool a100-3g is split into 3g.40gb", "why")
end

function T.shares_and_whole_gpus()
    local l4 = assert(gpu.model("L4"))
    local h100 = assert(gpu.model("H100-80GB"))
    local ts = { name = "l4", sharing = "time-slicing", replicas = 8 }
    local got = rightsize.allocation(l4, "time-slicing", ts, 6 * GIB)
    eq(got.name, "0.25 of a L4", "6 GiB of a 24 GB L4")
    eq(got.charge, 250, "charged a quarter")
    -- a replica holds one of the GPU's slots, as 10-gpu-sharing charges it: 1 GiB is 1/8 here
    eq(rightsize.allocation(l4, "time-slicing", ts, 1 * GIB).charge, 125, "1 GiB: the slot")
    eq(rightsize.allocation(l4, "mps", { name = "m", sharing = "mps", replicas = 8, mps_env = true }, 1 * GIB).charge,
        42, "1 GiB under MPS limits: the share")
    local none = rightsize.allocation(l4, "mps", { name = "l4", sharing = "mps" }, 25 * GIB)
    eq(none, nil, "25 GiB share of a 24 GB L4")
    eq(rightsize.allocation(h100, "exclusive", {}, 9 * GIB).name, "1 whole H100-80GB", "9 GiB")
    eq(rightsize.allocation(h100, "exclusive", {}, 81 * GIB).charge, 2000, "81 GiB: two GPUs")
end

function T.asked_memory_counts_as_the_sharing_policy_does()
    local a100 = assert(gpu.model("A100-80GB"))
    eq(rightsize.asked_memory({ whole = 1 }, a100), 80 * GIB, "a whole GPU")
    eq(rightsize.asked_memory({ whole = 1, memory_milli = 9 * GIB }, a100), 9 * GIB, "memory wins")
    eq(rightsize.asked_memory({ fraction_milli = 500, memory_milli = 9 * GIB }, a100), 40 * GIB,
        "the larger of fraction and memory")
end

function T.settings_and_checks()
    local s = rightsize.settings({})
    eq(s.mode, "off", "default mode")
    eq(s.headroom, 1.25, "default headroom")
    eq(s.min_history_s, 3600, "default min_history")
    eq(s.classes.inference and s.classes.batch and s.classes.interactive and not s.classes.training,
        true, "default classes leave training out")
    s = rightsize.settings({ rightsizing = { mode = "apply", min_history = "2d", classes = { "training" } } })
    eq(s.min_history_s, 172800, "2d")
    eq(s.classes.training and not s.classes.inference, true, "listed classes only")
    rightsize.check({ rightsizing = { mode = false } }) -- YAML 1.1's unquoted off
    raises(function() rightsize.check({ rightsizing = { mode = "on" } }) end,
        "rightsizing.mode: must be off, recommend or apply", "mode")
    raises(function() rightsize.check({ rightsizing = { headroom = 0.9 } }) end,
        "rightsizing.headroom: must be a number from 1 to 10", "headroom")
    raises(function() rightsize.check({ rightsizing = { min_history = "soon" } }) end,
        "rightsizing.min_history: must be a duration", "min_history")
    raises(function() rightsize.check({ rightsizing = { classes = { "batch", 3 } } }) end,
        "rightsizing.classes[1]: must be a class name", "classes")
end

function T.words_in_messages()
    eq(rightsize.span(604800), "7 days", "a week")
    eq(rightsize.span(3 * 3600 + 59), "3 hours", "hours")
    eq(rightsize.span(5400), "90 minutes", "below two hours")
    eq(rightsize.gib(7270), "7.1 GiB", "MiB as GiB")
end

function T.durations()
    eq(fleet.seconds("1h30m"), 5400, "1h30m")
    eq(fleet.seconds("2d"), 172800, "days")
    eq(fleet.seconds("1y"), nil, "no years")
    eq(fleet.seconds(""), nil, "empty")
end

return T
