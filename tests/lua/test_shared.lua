--[[
test_shared.lua - what the library keeps across requests is read-only (issue 35, item 10).

A VM serves every request of its worker thread, so a table a library module keeps (a catalog, a
model, what fleet.per_config built) and hands out is read by every later request: a policy that
wrote into it would change what the next pod of another namespace is charged.  These tests run
in one VM, as the requests of one worker do: a write must raise, and the next lookup must give
what the configuration says.  The configuration itself is read-only in the engine; cfg() makes
one the same way (gpuguard.readonly).
]]

local gg = require "gpuguard"
local fleet = require "fleet"
local gpu = require "gpu"
local quota = require "quota"
local rightsize = require "rightsize"
local testlib = require "testlib"

local eq, raises, same = testlib.eq, testlib.raises, testlib.same

local READ_ONLY = "attempt to modify a read-only table (shared configuration or library)"
local GIB_MILLI = 1024 * 1024 * 1024 * 1000

local T = {}

-- A configuration as the engine hands it to policies: read-only.
local function cfg()
    return gg.readonly(testlib.json({
        pools = {
            { name = "l4-ts", model = "L4", sharing = "time-slicing", replicas = 4,
              taints = { { key = "nvidia.com/gpu", value = "l4", effect = "NoSchedule" } },
              node_selector = { ["gpuguard.io/pool"] = "l4-ts" } },
            { name = "a100-mig", model = "A100-80GB", sharing = "mig" },
            { name = "h100", model = "H100-80GB", sharing = "exclusive" },
        },
        classes = {
            inference = { sharing = { "mig", "time-slicing", "exclusive" } },
            training = { sharing = { "exclusive" }, pools = { "h100" } },
        },
        default_class = "inference",
        rightsizing = { mode = "apply", classes = { "inference" } },
        gpu_models = { { name = "RTX-PRO-6000-96GB", memory = "96Gi",
                         profiles = { { name = "1g.24gb" }, { name = "4g.96gb" } } } },
    }))
end

-- fn must raise the read-only error, at the line that wrote unless a C function (table.insert)
-- did.
local function refused(fn, what, in_c)
    local ok, err = pcall(fn)
    if ok then
        error(what .. ": the write went through", 2)
    elseif not tostring(err):find(READ_ONLY, 1, true) then
        error(what .. ": not the read-only error: " .. tostring(err), 2)
    elseif not in_c and not err:find("test_shared.lua:", 1, true) then
        error(what .. ": the error does not name the line that wrote: " .. err, 2)
    end
end

-- The charge of a HAMi pod asking for 12 GiB of GPU memory on model (half an L4).
local function hami_charge(model)
    local spec = testlib.json({ containers = { { name = "c", resources = {
        limits = { ["nvidia.com/gpu"] = "1", ["nvidia.com/gpumem"] = "12288" } } } } })
    return assert(quota.pod_charge(spec, { model = model }))
end

T["fleet.model: a model is read-only and the next lookup gives the catalog's"] = function()
    for _, c in ipairs({ {}, cfg() }) do
        local l4 = fleet.model(c, "L4")
        eq(hami_charge(l4), 500, "half an L4")
        refused(function() l4.memory_milli = 24 * 1000 end, "memory_milli")
        refused(function() fleet.model(c, "L4").memory_mib = 24 end, "memory_mib")
        refused(function() l4.extra = true end, "a new field")
        refused(function() table.insert(fleet.model(c, "L4").aliases, "mine") end, "aliases", true)
        eq(fleet.model(c, "L4").memory_milli, 24 * GIB_MILLI, "still the catalog's")
        eq(fleet.model(c, "L4").memory_mib, 24 * 1024, "memory_mib")
        eq(fleet.model(c, "L4").extra, nil, "no new field")
        eq(hami_charge(fleet.model(c, "L4")), 500, "the next pod: still half an L4")
        same(fleet.model(c, "l4-24gb"), l4, "one table per model")
        same(fleet.model(c, c.pools and c.pools[1] or "L4"), l4, "by pool")
    end
end

T["fleet.model: profiles of a model are read-only, and gpu.profile gives their values"] = function()
    local c = cfg()
    local a100 = fleet.model(c, "A100-80GB")
    refused(function() a100.profiles[1].charge_milli = 1 end, "a profile's charge")
    refused(function() a100.profiles[1] = a100.profiles[7] end, "a profile")
    refused(function() table.sort(a100.profiles, function(x, y) return x.slices > y.slices end) end,
        "sorting the profiles", true)
    refused(function() table.remove(a100.profiles) end, "table.remove", true)
    eq(gpu.profile(a100, "1g.10gb").charge_milli, 143, "gpu.profile")
    eq(gpu.charge_milli(a100, "3g.40gb"), 429, "gpu.charge_milli")
    eq(gpu.pick_profile(a100, { memory_milli = 15 * GIB_MILLI }).name, "1g.20gb", "pick_profile")
    eq(#a100.profiles, 7, "every profile")
    -- gpu.profile and pick_profile hand out copies of the caller's own: editing one changes
    -- nothing the next call reads.
    local p = gpu.profile(a100, "1g.10gb")
    p.charge_milli = 1
    eq(gpu.profile(fleet.model(c, "A100-80GB"), "1g.10gb").charge_milli, 143, "a copy")
    local picked = gpu.pick_profile(a100, {})
    picked.memory_milli = 0
    eq(gpu.pick_profile(a100, {}).memory_milli, 10 * GIB_MILLI, "a copy")
    -- A configured model likewise.
    local rtx = fleet.model(c, "RTX-PRO-6000-96GB")
    refused(function() rtx.profiles[1].memory_milli = 0 end, "a configured profile")
    eq(gpu.profile(rtx, "1g.24gb").memory_milli, 24 * GIB_MILLI, "configured")
end

T["fleet.catalog: the catalog and all under it are read-only"] = function()
    local c = cfg()
    local cat = fleet.catalog(c)
    refused(function() cat.models.L4 = cat.models.T4 end, "a model")
    refused(function() cat.keys["l4"] = "T4" end, "a lookup key")
    refused(function() table.insert(cat.names, "mine") end, "the names", true)
    refused(function() cat.ambiguous.a100[1] = "L4" end, "an ambiguous name's candidates")
    same(fleet.catalog(c), cat, "kept")
    eq(gpu.model("l4", fleet.catalog(c)).name, "L4", "lookups as before")
    eq(gpu.models_named("A100", cat), { "A100-40GB", "A100-80GB" }, "models_named")
    local mine = gpu.models_named("A100", cat)
    mine[1] = "L4" -- a fresh list
    eq(gpu.models_named("A100", cat)[1], "A100-40GB", "models_named gives a fresh list")
    -- What gpu.catalog builds is the caller's own.
    local own = gpu.catalog(c)
    own.models.L4.memory_milli = 1
    eq(fleet.model(c, "L4").memory_milli, 24 * GIB_MILLI, "fleet's own catalog")
end

T["fleet.per_config: what it built is read-only, nested tables too"] = function()
    local of = fleet.per_config(function(c)
        return { n = #c.pools, names = { c.pools[1].name }, deep = { list = { 1, 2 } } }
    end)
    local c = cfg()
    local v = of(c)
    refused(function() v.n = 0 end, "a field")
    refused(function() v.names[1] = "mine" end, "a nested list")
    refused(function() v.deep.list[3] = 3 end, "deeper")
    refused(function() table.insert(v.names, "x") end, "table.insert", true)
    same(of(c), v, "the same view each time")
    eq(of(c), { n = 3, names = { "l4-ts" }, deep = { list = { 1, 2 } } }, "as built")
    eq(#of(c).deep.list, 2, "#")
    local n = 0
    for _ in pairs(of(c)) do
        n = n + 1
    end
    eq(n, 3, "pairs")
    eq(of(c).deep.list[2], 2, "reads")
    -- A copy of one's own to edit: gg.object / gg.array give a shallow copy.
    local mine = gg.array(v.names)
    mine[2] = "x"
    eq(#of(c).names, 1, "the copy is the caller's")
    -- Non-table results as they are.
    eq(fleet.per_config(function() return 7 end)(c), 7, "a number")
end

T["rightsize.settings kept per configuration (as 05-gpu-rightsizing does) are read-only"] = function()
    local settings_for = fleet.per_config(rightsize.settings)
    local c = cfg()
    local s = settings_for(c)
    refused(function() s.classes.training = true end, "classes")
    refused(function() s.headroom = 100 end, "headroom")
    eq(settings_for(c).classes.training, nil, "training still not rightsized")
    eq(settings_for(c).headroom, 1.25, "headroom")
    eq(settings_for(c).mode, "apply", "mode")
end

T["fleet.pool, pools, candidates: the configuration's pools, read-only"] = function()
    local c = cfg()
    refused(function() fleet.pool(c, "l4-ts").replicas = 1000 end, "a pool")
    refused(function() fleet.pool(c, "l4-ts").taints[1].effect = "PreferNoSchedule" end, "its taints")
    refused(function() fleet.pools(c)[1] = fleet.pools(c)[3] end, "the pools")
    same(fleet.pool(c, "l4-ts"), c.pools[1], "the configuration's own pool")
    eq(fleet.pool(c, "l4-ts").replicas, 4, "replicas")
    local list = assert(fleet.candidates(c, "training"))
    refused(function() list[1].pool.sharing = "mig" end, "a candidate's pool")
    list[1].mode = "mig" -- the list is the caller's own
    list[2] = list[1]
    local again = assert(fleet.candidates(c, "training"))
    eq(#again, 1, "class training's pools")
    eq(again[1].mode, "exclusive", "its mode")
    same(again[1].pool, fleet.pool(c, "h100"), "its pool")
end

T["fleet.gpu_taints, gpu_selectors: read-only"] = function()
    local c = cfg()
    refused(function() fleet.gpu_taints(c)[1].pool = "h100" end, "a taint's pool")
    refused(function() fleet.gpu_taints(c)[2] = fleet.gpu_taints(c)[1] end, "the list")
    refused(function() fleet.gpu_selectors(c)[1].value = "x" end, "a selector")
    eq(#fleet.gpu_taints(c), 1, "one taint")
    eq(fleet.gpu_taints(c)[1].pool, "l4-ts", "of l4-ts")
    eq(fleet.gpu_selectors(c)[1].value, "l4-ts", "selector")
end

T["fleet.class_modes: a fresh list, also without classes"] = function()
    for _, c in ipairs({ {}, cfg() }) do
        local modes = fleet.class_modes(c, "inference")
        table.insert(modes, "volcano")
        modes[1] = "dra"
        local again = fleet.class_modes(c, "inference")
        eq(again[1] ~= "dra" and again[#again] ~= "volcano", true, "unchanged")
    end
    eq(fleet.class_modes({}, "any"), { "exclusive", "mig", "mps", "time-slicing", "hami", "kai" },
        "every mode without classes")
    eq(#fleet.MODES, 6, "fleet.MODES")
    eq(fleet.candidates({ pools = { { name = "p", model = "L4", sharing = "exclusive" } } }, "x", "volcano"), nil,
        "volcano is no mode a class may ask for")
end

T["fleet.required_terms: the shared empty list is read-only"] = function()
    local none = fleet.required_terms({})
    refused(function() none[1] = { matchExpressions = {} } end, "the empty list")
    refused(function() table.insert(fleet.required_terms({}), {}) end, "table.insert", true)
    eq(#fleet.required_terms({ affinity = {} }), 0, "still empty")
    eq(fleet.gpu_ties({}, cfg()), {}, "no ties")
end

T["gpu.model without a catalog: a copy of one's own"] = function()
    local l4 = assert(gpu.model("L4"))
    l4.memory_milli = 1
    l4.profiles[1] = {}
    eq(gpu.model("L4").memory_milli, 24 * GIB_MILLI, "a copy")
    eq(#gpu.model("L4").profiles, 0, "a copy")
end

T["gpuguard.readonly: a view made once, reading as the table, refusing writes"] = function()
    local t = { a = 1, list = gg.array({ "x", "y" }), obj = gg.object({ k = "v" }) }
    local v = gg.readonly(t)
    same(gg.readonly(t), v, "one view per table")
    same(gg.readonly(v), v, "a view is its own view")
    eq(gg.readonly(3), 3, "a number")
    eq(gg.readonly("s"), "s", "a string")
    eq(gg.readonly(nil), nil, "nil")
    eq(v.a, 1, "reads")
    eq(#v.list, 2, "#")
    eq(gg.is_array(v.list), true, "marks kept")
    eq(gg.is_object(v.obj), true, "marks kept")
    eq(rawget(v, "a"), 1, "rawget")
    eq(next(v.obj), "k", "next")
    local seen = {}
    for i, x in ipairs(v.list) do
        seen[i] = x
    end
    eq(seen, { "x", "y" }, "ipairs")
    refused(function() v.a = 2 end, "a field")
    refused(function() v.list[3] = "z" end, "a list")
    raises(function() setmetatable(v, nil) end, "protected metatable", "its metatable")
    eq(getmetatable(v), "read-only", "its metatable is hidden")
    local copy = gg.object(v.obj)
    copy.k = "mine"
    eq(v.obj.k, "v", "gg.object copies")
    -- A table of the object (lazily filled by the engine) reads as it is.
    local pod = testlib.json({ metadata = { name = "p", labels = { app = "x" } } })
    eq(gg.readonly(pod).metadata.labels.app, "x", "an object's table")
end

return T
