--[[
test_gpu.lua - tests of lua/gpu.lua (the GPU catalog), run inside the policy sandbox.

Returns a table mapping test names to functions; a test fails by raising an error.  Expected
values come from NVIDIA's MIG User Guide tables, the GPU Operator's mig-parted config and the
k8s-device-plugin's naming.
]]

local gg = require "gpuguard"
local gpu = require "gpu"
local testlib = require "testlib"

-- Helpers -------------------------------------------------------------------------------------

-- A table compares on the fields a test names: catalog entries carry more.
local eq = testlib.eq_fields
local raises, raises_exactly = testlib.raises, testlib.raises_exactly
local readonly = testlib.readonly

local function q(s)
    return assert(gg.quantity(s))
end

-- The name of the profile picked, or "nil: <message>".
local function pick(model, want)
    local p, err = gpu.pick_profile(model, want)
    return p and p.name or "nil: " .. tostring(err)
end

local function mem(s)
    return { memory_milli = q(s) }
end

local function frac(f)
    return { fraction_milli = f }
end

local function names(profiles)
    local out = {}
    for i, p in ipairs(profiles) do
        out[i] = p.name
    end
    return table.concat(out, " ")
end

local T = {}

-- The built-in catalog ------------------------------------------------------------------------

T["every MIG model of the reference, with memory and compute slices"] = function()
    local want = {
        ["A30-24GB"] = { 24, 4 }, ["A100-40GB"] = { 40, 7 }, ["A100-80GB"] = { 80, 7 },
        ["H100-80GB"] = { 80, 7 }, ["H100-94GB"] = { 94, 7 }, ["H100-96GB"] = { 96, 7 },
        ["H200-141GB"] = { 141, 7 }, ["B200-180GB"] = { 180, 7 },
        ["GH200-144GB"] = { 144, 7 }, ["GB200-186GB"] = { 186, 7 },
    }
    for name, w in pairs(want) do
        local m = assert(gpu.model(name))
        eq(m.name, name, name .. ".name")
        eq(m.memory_mib, w[1] * 1024, name .. ".memory_mib")
        eq(m.memory_milli, q(w[1] .. "Gi"), name .. ".memory_milli")
        eq(m.slices, w[2], name .. ".slices")
        eq(m.mig, true, name .. ".mig")
        eq(#m.profiles > 0, true, name .. " has profiles")
    end
end

T["common shared GPUs without MIG"] = function()
    for name, gb in pairs({ L4 = 24, L40S = 48, A10 = 24, T4 = 16 }) do
        local m = assert(gpu.model(name))
        eq(m.memory_mib, gb * 1024, name .. ".memory_mib")
        eq(m.mig, false, name .. ".mig")
        eq(m.slices, nil, name .. ".slices")
        eq(#m.profiles, 0, name .. " profiles")
    end
end

T["the catalog lists canonical names in order"] = function()
    eq(table.concat(gpu.catalog().names, ","),
       "A30-24GB,A100-40GB,A100-80GB,H100-80GB,H100-94GB,H100-96GB,H200-141GB,B200-180GB,"
       .. "GH200-144GB,GB200-186GB,L4,L40S,A10,T4", "names")
end

T["GH200-144GB and GB200 are marked uncertain with a note"] = function()
    for _, name in ipairs(gpu.catalog().names) do
        local m = gpu.model(name)
        local uncertain = name == "GH200-144GB" or name == "GB200-186GB"
        eq(m.uncertain, uncertain, name .. ".uncertain")
        if uncertain then
            eq(type(m.note), "string", name .. ".note")
        end
    end
    eq(names(gpu.model("GB200").profiles),
       "1g.23gb 1g.23gb+me 1g.47gb 2g.47gb 3g.93gb 4g.93gb 7g.186gb", "GB200 profiles")
    eq(names(gpu.model("GH200-144GB").profiles),
       "1g.18gb 1g.18gb+me 1g.36gb 2g.36gb 3g.72gb 4g.72gb 7g.144gb", "GH200-144GB profiles")
end

T["A100-80GB profiles as the guide lists them"] = function()
    local m = gpu.model("A100-80GB")
    eq(names(m.profiles), "1g.10gb 1g.10gb+me 1g.20gb 2g.20gb 3g.40gb 4g.40gb 7g.80gb", "names")
    local want = {
        { "1g.10gb", 1, 10240, 7, false, "nvidia.com/mig-1g.10gb", 143 },
        { "1g.10gb+me", 1, 10240, 1, true, "nvidia.com/mig-1g.10gb.me", 143 },
        { "1g.20gb", 1, 20480, 4, false, "nvidia.com/mig-1g.20gb", 143 },
        { "2g.20gb", 2, 20480, 3, false, "nvidia.com/mig-2g.20gb", 286 },
        { "3g.40gb", 3, 40960, 2, false, "nvidia.com/mig-3g.40gb", 429 },
        { "4g.40gb", 4, 40960, 1, false, "nvidia.com/mig-4g.40gb", 572 },
        { "7g.80gb", 7, 81920, 1, false, "nvidia.com/mig-7g.80gb", 1000 },
    }
    for i, w in ipairs(want) do
        eq(m.profiles[i], { name = w[1], slices = w[2], memory_mib = w[3], max = w[4], me = w[5],
                            resource = w[6], charge_milli = w[7] }, w[1])
    end
end

T["A30 profiles: 4 compute slices, +me variants"] = function()
    local m = gpu.model("A30")
    eq(names(m.profiles), "1g.6gb 1g.6gb+me 2g.12gb 2g.12gb+me 4g.24gb", "names")
    local p = assert(gpu.profile(m, "2g.12gb+me"))
    eq(p, { slices = 2, memory_mib = 12288, max = 1, me = true, suffix = "+me",
            driver = "R525", memory_slices = 2 }, "2g.12gb+me")
    eq(gpu.profile(m, "1g.6gb").max, 4, "1g.6gb max")
    eq(gpu.profile(m, "4g.24gb").memory_slices, 4, "4g.24gb memory slices of 4")
end

T["A100-40GB: 1g.10gb has two eighths of memory (the guide's typo corrected)"] = function()
    local m = gpu.model("A100-40GB")
    eq(names(m.profiles), "1g.5gb 1g.5gb+me 1g.10gb 2g.10gb 3g.20gb 4g.20gb 7g.40gb", "names")
    eq(gpu.profile(m, "1g.10gb"), { max = 4, memory_slices = 2, memory_mib = 10240,
                                   driver = "R525", usable_gib = "9.62" }, "1g.10gb")
    eq(gpu.profile(m, "1g.5gb"), { max = 7, memory_slices = 1, memory_mib = 5120 }, "1g.5gb")
end

T["memory: nominal GB of the name as GiB, usable figure kept where the guide gives one"] = function()
    local p = gpu.profile("H100-80GB", "1g.10gb")
    eq(p.memory_mib, 10 * 1024, "nominal MiB")
    eq(p.memory_milli, q("10Gi"), "nominal milli")
    eq(p.usable_gib, "9.75", "usable GiB")
    eq(p.usable_mib, 9984, "usable MiB = floor(975 * 1024 / 100)")
    eq(p.usable_milli, q("9984Mi"), "usable milli")
    -- H100 NVL 1g.12gb: 10.75 GiB = 11008 MiB, the nvidia.com/mig-1g.12gb.memory label value.
    eq(gpu.profile("H100-NVL", "1g.12gb").usable_mib, 11008, "H100 NVL 1g.12gb")
    eq(gpu.profile("A100-40GB", "2g.10gb").usable_mib, 9850, "9.62 GiB rounded down")
    eq(gpu.profile("H100-94GB", "7g.94gb").usable_gib, "93.12", "7g.94gb usable")
    eq(gpu.profile("H200", "1g.18gb").usable_gib, nil, "no usable figure for H200")
    eq(gpu.profile("H200", "7g.141gb").memory_mib, 141 * 1024, "7g.141gb")
end

T["max instances follow the guide: 1g x7, double-memory 1g x4, +me x1"] = function()
    for _, name in ipairs({ "A100-80GB", "H100-80GB", "H100-94GB", "H100-96GB", "H200",
                            "B200", "GH200-144GB", "GB200" }) do
        local m = gpu.model(name)
        local counts = {}
        for _, p in ipairs(m.profiles) do
            counts[#counts + 1] = p.max
        end
        eq(table.concat(counts, ","), "7,1,4,3,2,1,1", name .. " max")
    end
end

T["every built-in profile is consistent"] = function()
    for _, name in ipairs(gpu.catalog().names) do
        local m = gpu.model(name)
        for _, p in ipairs(m.profiles) do
            local g, gb, suffix = gpu.parse_profile(p.name)
            eq(p.slices, g, p.name .. " slices")
            eq(p.memory_milli, q(gb .. "Gi"), p.name .. " memory")
            eq(p.me, suffix == "+me", p.name .. " me")
            eq(p.resource, gpu.mig_resource(p.name), p.name .. " resource")
            eq(#p.resource - #"nvidia.com/" <= 63, true, p.resource .. " length")
            eq(p.memory_milli <= m.memory_milli, true, p.name .. " fits the GPU")
            eq(p.charge_milli, gpu.charge_milli(m, p.name), p.name .. " charge")
            if p.usable_milli then
                eq(p.usable_milli < p.memory_milli, true, p.name .. " usable < nominal")
            end
        end
    end
end

-- Names ---------------------------------------------------------------------------------------

T["model names: aliases, products and GFD labels, any case"] = function()
    local cases = {
        ["A100-SXM4-80GB"] = "A100-80GB",
        ["NVIDIA-A100-80GB-PCIe"] = "A100-80GB",
        ["nvidia a100-sxm4-80gb"] = "A100-80GB",
        ["NVIDIA-A100-SXM4-80GB-MIG-1g.10gb"] = "A100-80GB",
        ["NVIDIA-A100-SXM4-80GB-SHARED"] = "A100-80GB",
        ["A100-SXM4-40GB"] = "A100-40GB",
        ["A100-SXM4-40GB-MIG-1g.5gb"] = "A100-40GB",
        ["A800-80GB"] = "A100-80GB",
        ["H100-SXM5-80GB"] = "H100-80GB",
        ["NVIDIA-H100-80GB-HBM3"] = "H100-80GB",
        ["NVIDIA H100 PCIe"] = "H100-80GB",
        ["NVIDIA-H100-NVL"] = "H100-94GB",
        ["NVIDIA-H100-NVL-MIG-1g.12gb"] = "H100-94GB",
        ["h20"] = "H100-96GB",
        ["GH200-480GB"] = "H100-96GB",
        ["NVIDIA-GH200-144G-HBM3e"] = "GH200-144GB",
        ["h200"] = "H200-141GB",
        ["NVIDIA-H200-NVL"] = "H200-141GB",
        ["B200"] = "B200-180GB",
        ["gb200"] = "GB200-186GB",
        ["a30"] = "A30-24GB",
        ["NVIDIA-A30"] = "A30-24GB",
        ["Tesla-T4"] = "T4",
        ["tesla t4"] = "T4",
        ["NVIDIA-L40S"] = "L40S",
        ["l4"] = "L4",
        ["a10_24gb"] = "A10",
    }
    for name, want in pairs(cases) do
        local m, err = gpu.model(name)
        eq(m and m.name or err, want, name)
    end
end

T["ambiguous and unknown model names say what to write"] = function()
    local m, err = gpu.model("A100")
    eq(m, nil, "A100")
    eq(err, 'GPU model "A100" is ambiguous: it may be A100-40GB or A100-80GB; name the memory '
       .. "size, such as A100-80GB", "A100 message")
    _, err = gpu.model("NVIDIA-GH200")
    eq(err, 'GPU model "NVIDIA-GH200" is ambiguous: it may be H100-96GB or GH200-144GB; name '
       .. "the memory size, such as GH200-144GB", "GH200 message")
    _, err = gpu.model("V100-32GB")
    eq(err, 'unknown GPU model "V100-32GB"; known models: A30-24GB, A100-40GB, A100-80GB, '
       .. "H100-80GB, H100-94GB, H100-96GB, H200-141GB, B200-180GB, GH200-144GB, GB200-186GB, "
       .. "L4, L40S, A10, T4 (add others under gpu_models in the configuration)", "unknown")
    raises(function() gpu.model(nil) end, "gpu.model: name must be a model name", "nil name")
end

T["models handed out are copies"] = function()
    local m = gpu.model("A100-80GB")
    m.profiles[1].memory_milli = 0
    m.memory_mib = 1
    table.remove(m.profiles)
    local again = gpu.model("A100-80GB")
    eq(again.memory_mib, 81920, "memory")
    eq(#again.profiles, 7, "profiles")
    eq(pick("A100-80GB", mem("1Gi")), "1g.10gb", "pick unaffected")
    local p = gpu.pick_profile("A100-80GB", mem("1Gi"))
    p.slices = 99
    eq(gpu.pick_profile("A100-80GB", mem("1Gi")).slices, 1, "picked profile is a copy")
end

-- Picking profiles ----------------------------------------------------------------------------

T["pick A100-80GB by memory"] = function()
    local cases = {
        { "1Gi", "1g.10gb" }, { "8Gi", "1g.10gb" }, { "10Gi", "1g.10gb" },
        { "10241Mi", "1g.20gb" }, { "18Gi", "1g.20gb" }, { "20Gi", "1g.20gb" },
        { "21Gi", "3g.40gb" }, { "40Gi", "3g.40gb" }, { "41Gi", "7g.80gb" },
        { "80Gi", "7g.80gb" }, { "16G", "1g.20gb" }, { "10G", "1g.10gb" },
    }
    for _, c in ipairs(cases) do
        eq(pick("A100-80GB", mem(c[1])), c[2], c[1])
    end
end

T["pick A100-80GB by fraction: ceil(fraction * 7) slices"] = function()
    local cases = {
        { 0, "1g.10gb" }, { 1, "1g.10gb" }, { 100, "1g.10gb" }, { 142, "1g.10gb" },
        { 143, "2g.20gb" }, -- 0.143 * 7 = 1.001 slices: two
        { 250, "2g.20gb" }, { 285, "2g.20gb" }, { 286, "3g.40gb" }, { 300, "3g.40gb" },
        { 428, "3g.40gb" }, { 429, "4g.40gb" }, { 500, "4g.40gb" }, { 571, "4g.40gb" },
        { 572, "7g.80gb" }, { 750, "7g.80gb" }, { 1000, "7g.80gb" },
    }
    for _, c in ipairs(cases) do
        eq(pick("A100-80GB", frac(c[1])), c[2], "fraction " .. c[1])
    end
end

T["pick by memory and fraction together"] = function()
    eq(pick("A100-80GB", { memory_milli = q("15Gi"), fraction_milli = 250 }), "2g.20gb",
       "15Gi, 0.25")
    eq(pick("A100-80GB", { memory_milli = q("30Gi"), fraction_milli = 100 }), "3g.40gb",
       "30Gi, 0.1")
    eq(pick("A100-80GB", { memory_milli = q("20Gi"), fraction_milli = 500 }), "4g.40gb",
       "20Gi, 0.5")
    eq(pick("A100-80GB", { memory_milli = q("50Gi"), fraction_milli = 100 }), "7g.80gb",
       "50Gi, 0.1")
    eq(pick("A100-80GB", { memory_milli = q("5Gi"), fraction_milli = 140 }), "1g.10gb",
       "5Gi, 0.14")
    eq(pick("H100-80GB", { memory_milli = q("18Gi"), fraction_milli = 200 }), "2g.20gb",
       "H100 18Gi, 0.2")
end

T["pick with nothing asked gives the smallest profile"] = function()
    eq(pick("A100-80GB", nil), "1g.10gb", "nil want")
    eq(pick("A30", {}), "1g.6gb", "empty want")
    eq(pick("A100-40GB", {}), "1g.5gb", "A100-40GB")
end

T["pick on A30 (4 slices)"] = function()
    local cases = {
        { mem("5Gi"), "1g.6gb" }, { mem("6Gi"), "1g.6gb" }, { mem("7Gi"), "2g.12gb" },
        { mem("12Gi"), "2g.12gb" }, { mem("13Gi"), "4g.24gb" }, { mem("24Gi"), "4g.24gb" },
        { frac(250), "1g.6gb" }, { frac(251), "2g.12gb" }, { frac(500), "2g.12gb" },
        { frac(501), "4g.24gb" }, { frac(1000), "4g.24gb" },
        { { memory_milli = q("4Gi"), fraction_milli = 400 }, "2g.12gb" },
    }
    for i, c in ipairs(cases) do
        eq(pick("A30-24GB", c[1]), c[2], "case " .. i)
    end
    eq(pick("A30", mem("25Gi")), "nil: no MIG profile of A30-24GB has 25Gi of memory; the "
       .. "largest is 4g.24gb (24Gi)", "too much")
end

T["pick on A100-40GB"] = function()
    local cases = {
        { mem("4Gi"), "1g.5gb" }, { mem("5Gi"), "1g.5gb" }, { mem("6Gi"), "1g.10gb" },
        { mem("10Gi"), "1g.10gb" }, { mem("11Gi"), "3g.20gb" }, { mem("20Gi"), "3g.20gb" },
        { mem("21Gi"), "7g.40gb" }, { frac(200), "2g.10gb" }, { frac(300), "3g.20gb" },
        { frac(550), "4g.20gb" }, { { memory_milli = q("8Gi"), fraction_milli = 250 }, "2g.10gb" },
    }
    for i, c in ipairs(cases) do
        eq(pick("A100-40GB", c[1]), c[2], "case " .. i)
    end
    eq(pick("A100-40GB", mem("48Gi")), "nil: no MIG profile of A100-40GB has 48Gi of memory; "
       .. "the largest is 7g.40gb (40Gi)", "too much")
end

T["pick on H100-80GB, nominal and usable memory"] = function()
    eq(pick("H100-80GB", mem("10Gi")), "1g.10gb", "nominal 10Gi")
    eq(pick("H100-80GB", { memory_milli = q("10Gi"), usable = true }), "1g.20gb",
       "usable 10Gi (1g.10gb has 9.75Gi)")
    eq(pick("H100-80GB", { memory_milli = q("9984Mi"), usable = true }), "1g.10gb",
       "usable 9984Mi")
    eq(pick("H100-80GB", { memory_milli = q("40Gi"), usable = true }), "7g.80gb",
       "usable 40Gi")
    eq(pick("H100-80GB", { memory_milli = q("80Gi"), usable = true }),
       "nil: no MIG profile of H100-80GB has 80Gi of usable memory; the largest is 7g.80gb "
       .. "(79.25Gi usable)", "usable 80Gi")
    eq(pick("H100-80GB", frac(430)), "4g.40gb", "0.43")
    eq(pick("H100-SXM5-80GB", mem("79Gi")), "7g.80gb", "alias")
end

T["pick on H200 and H100 NVL"] = function()
    local cases = {
        { mem("16Gi"), "1g.18gb" }, { mem("18Gi"), "1g.18gb" }, { mem("20Gi"), "1g.35gb" },
        { mem("35Gi"), "1g.35gb" }, { mem("36Gi"), "3g.71gb" }, { mem("100Gi"), "7g.141gb" },
        { frac(400), "3g.71gb" }, { { memory_milli = q("30Gi"), fraction_milli = 250 }, "2g.35gb" },
    }
    for i, c in ipairs(cases) do
        eq(pick("H200-141GB", c[1]), c[2], "case " .. i)
    end
    eq(pick("H200", mem("150Gi")), "nil: no MIG profile of H200-141GB has 150Gi of memory; "
       .. "the largest is 7g.141gb (141Gi)", "too much")
    eq(pick("H100-NVL", mem("22Gi")), "1g.24gb", "H100 NVL 22Gi")
    eq(pick("H100-NVL", mem("25Gi")), "3g.47gb", "H100 NVL 25Gi")
    eq(pick("H100-NVL", { memory_milli = q("22Gi"), usable = true }), "3g.47gb",
       "H100 NVL 22Gi usable (1g.24gb has 21.62Gi)")
    eq(pick("B200", mem("40Gi")), "1g.45gb", "B200 40Gi")
end

T["the brief's example message for 90Gi on A100-80GB"] = function()
    local p, err = gpu.pick_profile("A100-80GB", mem("90Gi"))
    eq(p, nil, "profile")
    eq(err, "no MIG profile of A100-80GB has 90Gi of memory; the largest is 7g.80gb (80Gi)",
       "message")
end

T["+me profiles are never picked unless allowed"] = function()
    for _, name in ipairs(gpu.catalog().names) do
        for _, gb in ipairs({ 1, 5, 6, 10, 12, 18, 23, 40, 90 }) do
            for _, f in ipairs({ 0, 100, 143, 250, 500 }) do
                local p = gpu.pick_profile(name, { memory_milli = q(gb .. "Gi"),
                                                   fraction_milli = f })
                if p then
                    eq(p.me, false, name .. " " .. gb .. "Gi " .. f)
                    eq(p.suffix, "", name .. " " .. gb .. "Gi " .. f .. " suffix")
                end
            end
        end
    end
    -- allowed: the plain profile still wins a tie; a model with only the +me 1g picks it.
    eq(pick("A100-80GB", { memory_milli = q("8Gi"), allow_me = true }), "1g.10gb", "tie")
    local cat = gpu.catalog({ gpu_models = {
        { name = "Media-GPU", memory = "40Gi", profiles = {
            { name = "1g.10gb+me" }, { name = "4g.40gb" } } } } })
    local m = cat.models["Media-GPU"]
    eq(pick(m, mem("8Gi")), "4g.40gb", "+me excluded")
    eq(pick(m, { memory_milli = q("8Gi"), allow_me = true }), "1g.10gb+me", "+me allowed")
end

T["fraction too large for a configured model without its full profile"] = function()
    local cat = gpu.catalog({ gpu_models = {
        { name = "Half-GPU", memory = "80Gi", slices = 7,
          profiles = { { name = "1g.10gb" }, { name = "4g.40gb" } } } } })
    local m = cat.models["Half-GPU"]
    eq(pick(m, frac(600)), "nil: no MIG profile of Half-GPU has 5 of 7 compute slices; the "
       .. "largest is 4g.40gb (4 slices)", "fraction")
    eq(pick(m, { memory_milli = q("60Gi"), fraction_milli = 600 }), "nil: no MIG profile of "
       .. "Half-GPU has 60Gi of memory and 5 of 7 compute slices; the largest is 4g.40gb "
       .. "(40Gi, 4 slices)", "both")
end

T["pick on a GPU without MIG, or an unknown one"] = function()
    eq(pick("L4", mem("8Gi")), "nil: GPU model L4 has no MIG profiles (it does not support MIG)",
       "L4")
    eq(pick("A100", mem("8Gi")), 'nil: GPU model "A100" is ambiguous: it may be A100-40GB or '
       .. "A100-80GB; name the memory size, such as A100-80GB", "ambiguous")
end

T["pick_profile rejects malformed wants"] = function()
    raises(function() gpu.pick_profile("A100-80GB", { memory_milli = 1.5 }) end,
           "gpu.pick_profile: want.memory_milli must be a non-negative integer", "float memory")
    raises(function() gpu.pick_profile("A100-80GB", { memory_milli = "8Gi" }) end,
           "want.memory_milli", "string memory")
    raises(function() gpu.pick_profile("A100-80GB", { fraction_milli = 1001 }) end,
           "gpu.pick_profile: want.fraction_milli must be an integer from 0 to 1000, got the integer 1001",
           "fraction above one")
    raises(function() gpu.pick_profile("A100-80GB", { fraction_milli = 0.25 }) end,
           "want.fraction_milli", "float fraction")
    raises(function() gpu.pick_profile(42, {}) end, "gpu.pick_profile: model must be",
           "number model")
    raises(function() gpu.pick_profile("A100-80GB", "8Gi") end, "gpu.pick_profile: want must",
           "string want")
end

-- Resource names and labels -------------------------------------------------------------------

T["MIG resource names: + written ."] = function()
    eq(gpu.mig_resource("1g.10gb"), "nvidia.com/mig-1g.10gb", "1g.10gb")
    eq(gpu.mig_resource("1g.10gb+me"), "nvidia.com/mig-1g.10gb.me", "1g.10gb+me")
    eq(gpu.mig_resource("1g.6gb+me"), "nvidia.com/mig-1g.6gb.me", "A30 1g.6gb+me")
    eq(gpu.mig_resource("2g.12gb+me"), "nvidia.com/mig-2g.12gb.me", "A30 2g.12gb+me")
    eq(gpu.mig_resource("1g.24gb+me.all"), "nvidia.com/mig-1g.24gb.me.all", "+me.all")
    eq(gpu.mig_resource("7g.141gb"), "nvidia.com/mig-7g.141gb", "7g.141gb")
    eq(gpu.mig_resource(gpu.profile("H200", "1g.18gb+me")), "nvidia.com/mig-1g.18gb.me", "table")
    raises(function() gpu.mig_resource("1g10gb") end,
           'gpu.mig_resource: "1g10gb" is not a MIG profile name such as 1g.10gb or 1g.10gb+me',
           "bad name")
    raises(function() gpu.mig_resource(nil) end, "gpu.mig_resource: profile must be", "nil")
end

T["MIG profile of a resource name"] = function()
    local cases = {
        ["nvidia.com/mig-1g.10gb"] = { "1g.10gb", false },
        ["nvidia.com/mig-1g.10gb.me"] = { "1g.10gb+me", false },
        ["nvidia.com/mig-3g.40gb.shared"] = { "3g.40gb", true },
        ["nvidia.com/mig-1g.10gb.me.shared"] = { "1g.10gb+me", true },
        ["nvidia.com/mig-1g.24gb.me.all"] = { "1g.24gb+me.all", false },
    }
    for res, w in pairs(cases) do
        local p, shared = gpu.mig_profile_of(res)
        eq(p, w[1], res)
        eq(shared, w[2], res .. " shared")
    end
    for _, res in ipairs({ "nvidia.com/gpu", "nvidia.com/mig-", "nvidia.com/mig-big",
                           "example.com/mig-1g.10gb", "nvidia.com/mig-1g.10gb.shared.x" }) do
        eq(gpu.mig_profile_of(res), nil, res)
    end
end

T["MIG product labels for the single strategy"] = function()
    eq(gpu.mig_product_label("A100-80GB", "1g.10gb"), "NVIDIA-A100-SXM4-80GB-MIG-1g.10gb",
       "default product")
    eq(gpu.mig_product_label("NVIDIA-A100-80GB-PCIe", "3g.40gb"),
       "NVIDIA-A100-80GB-PCIe-MIG-3g.40gb", "the product named")
    eq(gpu.mig_product_label("A100-80GB-PCIe", "3g.40gb"),
       "NVIDIA-A100-80GB-PCIe-MIG-3g.40gb", "the product named without NVIDIA-")
    eq(gpu.mig_product_label("H100-94GB", "1g.12gb"), "NVIDIA-H100-NVL-MIG-1g.12gb",
       "the reference's H100 NVL label")
    eq(gpu.mig_product_label("A100-40GB", "1g.5gb", "A100-SXM4-40GB"),
       "A100-SXM4-40GB-MIG-1g.5gb", "the GFD README's older-driver example")
    eq(gpu.mig_product_label("H100-80GB", "1g.10gb+me"), "NVIDIA-H100-80GB-HBM3-MIG-1g.10gbme",
       "+ dropped by GFD's sanitiser")
    eq(gpu.mig_product_label("A100-80GB", "2g.20gb", "NVIDIA A100-SXM4-80GB"),
       "NVIDIA-A100-SXM4-80GB-MIG-2g.20gb", "NVML name with a blank")
    eq(gpu.mig_product_label(gpu.model("A30"), gpu.profile("A30", "2g.12gb")),
       "NVIDIA-A30-MIG-2g.12gb", "tables")
    local l, err = gpu.mig_product_label("A100-80GB", "1g.5gb")
    eq(l, nil, "wrong profile")
    eq(err, 'GPU model A100-80GB has no MIG profile "1g.5gb"; its profiles are 1g.10gb, '
       .. "1g.10gb+me, 1g.20gb, 2g.20gb, 3g.40gb, 4g.40gb, 7g.80gb", "wrong profile message")
    l, err = gpu.mig_product_label("L40S", "1g.10gb")
    eq(err, "GPU model L40S has no MIG profiles (it does not support MIG)", "no MIG")
end

T["every built-in product label is a valid label value"] = function()
    for _, name in ipairs(gpu.catalog().names) do
        local m = gpu.model(name)
        for _, product in ipairs(m.products) do
            for _, p in ipairs(m.profiles) do
                local label = gpu.mig_product_label(product, p.name)
                eq(#label <= 63, true, label .. " length")
                eq(label:match("^[%w][%w%-_%.]*[%w]$") ~= nil, true, label .. " characters")
            end
        end
    end
end

-- Charges -------------------------------------------------------------------------------------

T["charges: compute fraction rounded up"] = function()
    local cases = {
        { "A100-80GB", "1g.10gb", 143 }, { "A100-80GB", "1g.10gb+me", 143 },
        { "A100-80GB", "1g.20gb", 143 }, { "A100-80GB", "2g.20gb", 286 },
        { "A100-80GB", "3g.40gb", 429 }, { "A100-80GB", "4g.40gb", 572 },
        { "A100-80GB", "7g.80gb", 1000 }, { "A100-40GB", "3g.20gb", 429 },
        { "H200", "2g.35gb", 286 }, { "A30", "1g.6gb", 250 }, { "A30", "2g.12gb", 500 },
        { "A30", "2g.12gb+me", 500 }, { "A30", "4g.24gb", 1000 },
    }
    for _, c in ipairs(cases) do
        eq(gpu.charge_milli(c[1], c[2]), c[3], c[1] .. " " .. c[2])
    end
    local n, err = gpu.charge_milli("A30", "1g.10gb")
    eq(n, nil, "unknown profile")
    eq(err, 'GPU model A30-24GB has no MIG profile "1g.10gb"; its profiles are 1g.6gb, '
       .. "1g.6gb+me, 2g.12gb, 2g.12gb+me, 4g.24gb", "unknown profile message")
end

T["whole GPU charges"] = function()
    eq(gpu.whole_charge(0), 0, "0")
    eq(gpu.whole_charge(1), 1000, "1")
    eq(gpu.whole_charge(8), 8000, "8")
    raises(function() gpu.whole_charge(-1) end, "gpu.whole_charge: n must be a non-negative "
           .. "integer, got the integer -1", "negative")
    raises(function() gpu.whole_charge(1.5) end, "got the float 1.5", "float")
end

-- Configuration -------------------------------------------------------------------------------

local RTX = {
    name = "RTX-PRO-6000-96GB", memory = "96Gi", aliases = { "RTX PRO 6000" },
    products = { "NVIDIA-RTX-PRO-6000-Blackwell-Server-Edition" },
    profiles = {
        { name = "1g.24gb", max = 4 }, { name = "1g.24gb+me", max = 1 },
        { name = "1g.24gb+gfx" }, { name = "2g.48gb", usable = "47Gi" }, { name = "4g.96gb" },
    },
}

T["configured models join the catalog"] = function()
    local cat = gpu.catalog({ gpu_models = { RTX, { name = "L20", memory = "48Gi" } } })
    eq(cat.names[#cat.names - 1], "RTX-PRO-6000-96GB", "added in order")
    eq(cat.names[#cat.names], "L20", "second")
    local m = assert(gpu.model("rtx pro 6000", cat))
    eq(m, { name = "RTX-PRO-6000-96GB", slices = 4, memory_mib = 98304, mig = true,
            builtin = false, uncertain = false }, "model")
    eq(names(m.profiles), "1g.24gb 1g.24gb+gfx 1g.24gb+me 2g.48gb 4g.96gb", "profiles")
    eq(gpu.profile(m, "2g.48gb"), { max = 2, usable_mib = 48128, memory_mib = 49152 }, "defaults")
    eq(gpu.profile(m, "1g.24gb+gfx"), { max = 1, me = false, suffix = "+gfx" }, "+gfx")
    eq(pick(m, mem("30Gi")), "2g.48gb", "pick")
    eq(pick(m, frac(250)), "1g.24gb", "pick, +gfx never")
    eq(gpu.charge_milli(m, "2g.48gb"), 500, "charge")
    eq(gpu.mig_product_label(m, "1g.24gb"),
       "NVIDIA-RTX-PRO-6000-Blackwell-Server-Edition-MIG-1g.24gb", "product label")
    eq(gpu.model("NVIDIA-RTX-PRO-6000-Blackwell-Server-Edition", cat).name,
       "RTX-PRO-6000-96GB", "product lookup")
    local l20 = gpu.model("l20", cat)
    eq(l20, { mig = false, memory_mib = 49152, product = "L20" }, "model without MIG")
    eq(gpu.model("A100-SXM4-80GB", cat).name, "A100-80GB", "built-ins still there")
    eq(gpu.model("L20"), nil, "the built-in catalog is unchanged")
end

T["configured slices are derived from the largest profile"] = function()
    local cat = gpu.catalog({ gpu_models = { { name = "Custom-7", memory = "70Gi",
        profiles = { { name = "1g.10gb" }, { name = "7g.70gb" } } } } })
    local m = cat.models["Custom-7"]
    eq(m.slices, 7, "slices")
    eq(gpu.profile(m, "1g.10gb").max, 7, "max default 7 // 1")
    eq(gpu.charge_milli(m, "1g.10gb"), 143, "charge")
end

T["a configured model may replace a built-in one"] = function()
    local cat = gpu.catalog({ gpu_models = { {
        name = "a100-80gb", memory = "80Gi", slices = 7,
        profiles = { { name = "1g.10gb", usable = "9728Mi" }, { name = "3g.40gb" },
                     { name = "7g.80gb" } } } } })
    local m = gpu.model("A100-SXM4-80GB", cat)
    eq(m.name, "A100-80GB", "canonical name kept")
    eq(m.builtin, false, "from the configuration")
    eq(names(m.profiles), "1g.10gb 3g.40gb 7g.80gb", "profiles replaced")
    eq(m.product, "NVIDIA-A100-SXM4-80GB", "built-in products kept")
    eq(pick(m, { memory_milli = q("9.5Gi"), usable = true }), "1g.10gb", "usable from config")
    eq(pick(m, { memory_milli = q("9.6Gi"), usable = true }), "3g.40gb", "over the usable 9.5Gi")
    eq(pick(m, mem("15Gi")), "3g.40gb", "no 1g.20gb any more")
    eq(#cat.names, 14, "no new name")
end

T["configured aliases may settle an ambiguous name"] = function()
    local cat = gpu.catalog({ gpu_models = { { name = "A100-80GB", memory = "80Gi",
        aliases = { "A100" }, profiles = { { name = "7g.80gb" } } } } })
    eq(gpu.model("a100", cat).name, "A100-80GB", "A100")
    eq(gpu.model("A100-40GB", cat).name, "A100-40GB", "others unchanged")
end

T["the configuration may be a read-only proxy"] = function()
    local cfg = readonly({ gpu_models = { RTX }, other = "x" })
    local cat = gpu.catalog(cfg)
    eq(gpu.model("RTX-PRO-6000-96GB", cat).slices, 4, "read through the proxy")
    eq(pick(cat.models["RTX-PRO-6000-96GB"], mem("90Gi")), "4g.96gb", "pick")
    local ok, err = pcall(gpu.catalog, readonly({ gpu_models = { { name = "X", memory = 5 } } }))
    eq(ok, false, "bad entry through a proxy")
    eq(err, "gpu_models[1].memory: must be a quantity such as 48Gi, got the integer 5", "message")
end

T["no configuration, or no gpu_models, gives the built-in catalog"] = function()
    eq(#gpu.catalog().names, 14, "nil")
    eq(#gpu.catalog({}).names, 14, "empty")
    eq(#gpu.catalog({ gpu_models = gg.null }).names, 14, "null")
    eq(#gpu.catalog({ gpu_models = {} }).names, 14, "empty list")
    raises(function() gpu.catalog("gpu_models") end, "gpu.catalog: cfg must be", "string cfg")
end

T["configuration errors name the key path"] = function()
    local good = { name = "Good-GPU", memory = "48Gi" }
    local function models(...)
        local entries = { ... }
        return function() gpu.catalog({ gpu_models = entries }) end
    end
    local cases = {
        { function() gpu.catalog({ gpu_models = "A100" }) end,
          'gpu_models: must be a list of GPU models ({name, memory, slices, profiles}), got "A100"' },
        { function() gpu.catalog({ gpu_models = { name = "X" } }) end,
          "gpu_models: must be a list of GPU models ({name, memory, slices, profiles}), got an object" },
        { models("X"), 'gpu_models[1]: must be a mapping with name and memory, got "X"' },
        { models({ memory = "48Gi" }), "gpu_models[1].name: must be a model name of letters, "
          .. "digits, '.', '-' and '_', such as RTX-PRO-6000-96GB, got null" },
        { models({ name = "X/Y", memory = "48Gi" }), "gpu_models[1].name: must be a model name "
          .. "of letters, digits, '.', '-' and '_', such as RTX-PRO-6000-96GB, got \"X/Y\"" },
        { models(good, { name = "X" }),
          "gpu_models[2].memory: must be a quantity such as 48Gi, got null" },
        { models({ name = "X", memory = "lots" }),
          'gpu_models[1].memory: must be a quantity such as 48Gi, got "lots"' },
        { models({ name = "X", memory = "48" }),
          'gpu_models[1].memory: "48" is less than 1Mi; write the unit, such as 48Gi' },
        { models({ name = "X", memory = "48Gi", slices = 9 }),
          "gpu_models[1].slices: must be a whole number from 1 to 8, got the integer 9" },
        { models({ name = "X", memory = "48Gi", profiles = "1g.12gb" }),
          'gpu_models[1].profiles: must be a list of MIG profiles, got "1g.12gb"' },
        { models(good, { name = "X", memory = "48Gi", profiles = { { name = "1g.12gb",
          memory = "twelve" } } }),
          'gpu_models[2].profiles[1].memory: must be a quantity such as 12Gi, got "twelve"' },
        { models({ name = "X", memory = "48Gi", profiles = { { name = "1g12gb" } } }),
          'gpu_models[1].profiles[1].name: must be a MIG profile name such as 1g.12gb or '
          .. '1g.12gb+me, got "1g12gb"' },
        { models({ name = "X", memory = "48Gi", slices = 4, profiles = { { name = "7g.48gb" } } }),
          "gpu_models[1].profiles[1].name: 7g.48gb has 7 compute slices, more than the GPU's 4" },
        { models({ name = "X", memory = "48Gi", profiles = { { name = "1g.12gb+xyz" } } }),
          "gpu_models[1].profiles[1].name: 1g.12gb+xyz: unknown attribute +xyz (known: +me, "
          .. "+me.all, +gfx, -me)" },
        { models({ name = "X", memory = "48Gi", profiles = { { name = "2g.24gb", slices = 3 } } }),
          "gpu_models[1].profiles[1].slices: must be 2 as the name 2g.24gb says, got the integer 3" },
        { models({ name = "X", memory = "48Gi", profiles = { { name = "4g.96gb" } } }),
          "gpu_models[1].profiles[1].memory: 96Gi is more than the GPU's 48Gi" },
        { models({ name = "X", memory = "48Gi", profiles = { { name = "1g.12gb", max = 0 } } }),
          "gpu_models[1].profiles[1].max: must be a whole number from 1 to 64, got the integer 0" },
        { models({ name = "X", memory = "48Gi", profiles = { { name = "1g.12gb", me = "yes" } } }),
          'gpu_models[1].profiles[1].me: must be true or false, got "yes"' },
        { models({ name = "X", memory = "48Gi", profiles = { { name = "1g.12gb", usable = "13Gi" } } }),
          'gpu_models[1].profiles[1].usable: "13Gi" is more than the profile\'s 12Gi' },
        { models({ name = "X", memory = "48Gi", profiles = { { name = "1g.12gb" },
                                                             { name = "1g.12gb" } } }),
          "gpu_models[1].profiles[2].name: 1g.12gb is already gpu_models[1].profiles[1]" },
        { models({ name = "A100-SXM4-80GB", memory = "80Gi" }),
          'gpu_models[1].name: "A100-SXM4-80GB" already names the built-in model A100-80GB; '
          .. "use name: A100-80GB to replace it" },
        { models(good, { name = "good-gpu", memory = "48Gi" }),
          'gpu_models[2].name: "good-gpu" is already gpu_models[1]' },
        { models({ name = "X", memory = "48Gi", aliases = { "L40S-48GB" } }),
          'gpu_models[1].aliases[1]: "L40S-48GB" already names L40S' },
        { models({ name = "X", memory = "48Gi", aliases = { "" } }),
          'gpu_models[1].aliases[1]: must be a non-empty string, got ""' },
        { models({ name = "X", memory = "48Gi", products = "NVIDIA-X" }),
          'gpu_models[1].products: must be a list of names, got "NVIDIA-X"' },
        { models({ name = "X", memory = "48Gi", uncertain = "maybe" }),
          'gpu_models[1].uncertain: must be true or false, got "maybe"' },
    }
    for i, c in ipairs(cases) do
        raises_exactly(c[1], c[2], "case " .. i)
    end
end

-- What containers ask for ---------------------------------------------------------------------

local function container(limits, requests)
    return { name = "main", resources = { limits = limits, requests = requests } }
end

local function list(items)
    local out = {}
    for i, it in ipairs(items) do
        out[i] = string.format("%s=%d/%s/%s%s", it.resource, it.count, it.kind, it.unit,
                               it.profile and "/" .. it.profile or "")
    end
    return table.concat(out, " ")
end

T["requested: whole GPUs, MIG devices and shared replicas"] = function()
    eq(list(gpu.requested(container({ ["nvidia.com/gpu"] = "2", memory = "8Gi" }))),
       "nvidia.com/gpu=2/whole/devices", "whole")
    eq(list(gpu.requested(container({ ["nvidia.com/mig-1g.10gb"] = "1",
                                      ["nvidia.com/mig-3g.40gb"] = 2 }))),
       "nvidia.com/mig-1g.10gb=1/mig/devices/1g.10gb nvidia.com/mig-3g.40gb=2/mig/devices/3g.40gb",
       "mig (a YAML integer too)")
    eq(list(gpu.requested(container({ ["nvidia.com/mig-1g.10gb.me"] = "1" }))),
       "nvidia.com/mig-1g.10gb.me=1/mig/devices/1g.10gb+me", "+me")
    eq(list(gpu.requested(container({ ["nvidia.com/gpu.shared"] = "1",
                                      ["nvidia.com/mig-1g.10gb.shared"] = "3" }))),
       "nvidia.com/gpu.shared=1/shared/replicas "
       .. "nvidia.com/mig-1g.10gb.shared=3/shared/replicas/1g.10gb", "shared")
end

T["requested: DRA extended resources of NVIDIA's GPU device classes"] = function()
    local items = gpu.requested(container({
        ["deviceclass.resource.kubernetes.io/gpu.nvidia.com"] = "2",
        ["deviceclass.resource.kubernetes.io/mig.nvidia.com"] = "1",
        ["deviceclass.resource.kubernetes.io/rdma.example.com"] = "4" }))
    eq(list(items), "deviceclass.resource.kubernetes.io/gpu.nvidia.com=2/dra/devices "
       .. "deviceclass.resource.kubernetes.io/mig.nvidia.com=1/dra/devices", "GPU classes only")
    eq(items[1].class .. " " .. items[2].class, "gpu.nvidia.com mig.nvidia.com", "their classes")
end

T["requested: HAMi and Volcano resources"] = function()
    eq(list(gpu.requested(container({ ["nvidia.com/gpu"] = "1", ["nvidia.com/gpumem"] = "8000",
                                      ["nvidia.com/gpucores"] = "30",
                                      ["nvidia.com/gpumem-percentage"] = "25",
                                      ["nvidia.com/priority"] = "1" }))),
       "nvidia.com/gpu=1/whole/devices nvidia.com/gpucores=30/hami/percent "
       .. "nvidia.com/gpumem=8000/hami/MiB nvidia.com/gpumem-percentage=25/hami/percent", "hami")
    eq(list(gpu.requested(container({ ["volcano.sh/vgpu-number"] = "2",
                                      ["volcano.sh/vgpu-memory"] = "3000",
                                      ["volcano.sh/vgpu-cores"] = "50" }))),
       "volcano.sh/vgpu-cores=50/volcano/percent volcano.sh/vgpu-memory=3000/volcano/MiB "
       .. "volcano.sh/vgpu-number=2/volcano/devices", "volcano")
end

T["requested: requests or limits, zero and non-GPU resources left out"] = function()
    eq(list(gpu.requested(container(nil, { ["nvidia.com/gpu"] = "1" }))),
       "nvidia.com/gpu=1/whole/devices", "requests only")
    eq(list(gpu.requested(container({ ["nvidia.com/gpu"] = "2" }, { ["nvidia.com/gpu"] = "2" }))),
       "nvidia.com/gpu=2/whole/devices", "both, once")
    eq(list(gpu.requested(container({ ["nvidia.com/gpu"] = "0", cpu = "1",
                                      ["amd.com/gpu"] = "1" }))), "", "zero and others")
    eq(#gpu.requested({ name = "x" }), 0, "no resources")
    eq(#gpu.requested({ name = "x", resources = gg.null }), 0, "null resources")
    eq(#gpu.requested(nil), 0, "nil container")
    raises(function() gpu.requested(container({ ["nvidia.com/gpu"] = "500m" })) end,
           'gpu.requested: container "main": nvidia.com/gpu = 500m must be a whole number',
           "fraction")
    raises(function() gpu.requested(container({ ["nvidia.com/gpu"] = "one" })) end,
           'is not a quantity', "malformed")
end

T["requested: the request wins over the limit, null is missing, other values raise"] = function()
    eq(list(gpu.requested(container({ ["nvidia.com/gpu"] = "3" }, { ["nvidia.com/gpu"] = "2" }))),
       "nvidia.com/gpu=2/whole/devices", "request")
    eq(list(gpu.requested(container({ ["nvidia.com/gpu"] = "3" }, { ["nvidia.com/gpu"] = gg.null }))),
       "nvidia.com/gpu=3/whole/devices", "null request")
    eq(list(gpu.requested(container(nil, { ["nvidia.com/gpu"] = 4 }))),
       "nvidia.com/gpu=4/whole/devices", "a YAML integer request")
    raises(function()
        gpu.requested(container({ ["nvidia.com/gpu"] = "1" }, { ["nvidia.com/gpu"] = false }))
    end, 'resources.requests["nvidia.com/gpu"] is a boolean, want a quantity string', "boolean")
end

T["requested: the same answers past the memo of resource names"] = function()
    local limits = { ["nvidia.com/mig-1g.10gb"] = "1" }
    for i = 1, 300 do
        limits["example.com/r" .. i] = "1"
    end
    for _ = 1, 2 do
        eq(list(gpu.requested(container(limits))), "nvidia.com/mig-1g.10gb=1/mig/devices/1g.10gb",
           "mig among many names")
        eq(list(gpu.requested(container({ ["nvidia.com/mig-2g.20gb.shared"] = "2", cpu = "1" }))),
           "nvidia.com/mig-2g.20gb.shared=2/shared/replicas/2g.20gb", "a name first seen now")
    end
end

T["requested on a decoded pod"] = function()
    local c = gg.object({ name = "trainer", resources = gg.object({
        limits = gg.object({ ["nvidia.com/mig-2g.20gb"] = "1", memory = "16Gi" }),
        requests = gg.object({ cpu = "2" }) }) })
    eq(list(gpu.requested(c)), "nvidia.com/mig-2g.20gb=1/mig/devices/2g.20gb", "decoded")
    eq(gpu.charge_milli("A100-80GB", gpu.requested(c)[1].profile), 286, "charge of it")
end

return T
