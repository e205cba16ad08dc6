--[[
gpu.lua - the GPU catalog of gpuguard: GPU models, their memory and MIG profiles, the resource
names and node labels the NVIDIA device plugin and GPU Feature Discovery (GFD) use for them, the
choice of the smallest MIG profile that covers a request, charges in milli-GPU, and recognising
the GPU resources a container already asks for.

Facts come from NVIDIA's MIG User Guide ("Supported MIG Profiles" tables), the GPU Operator's
default mig-parted config and the k8s-device-plugin sources.
See lua/README.md for the full reference.

Conventions:
  * Memory is kept three ways: memory_mib (integer MiB), memory_milli (bytes * 1000, the unit
    gg.quantity gives, so it compares directly with a parsed "18Gi") and, for profiles, the
    figure of the name: "<G>g.<M>gb" has M * 1024 MiB (the GB of the name read as GiB).  The
    guide's usable memory (nvidia-smi GiB, two decimals) is kept as usable_gib where known.
  * Model names are matched case-insensitively through aliases and GFD product names.
  * Lookups that can fail on data (an unknown model or profile, nothing fits) return nil and a
    message; wrong argument types raise an error naming the function.  Configuration errors
    (gpu.catalog) raise error(msg, 0) with the key path.
  * Integer arithmetic only.
Must not: keep state between calls (beyond a bounded memo of what each resource name means), or
hand out its own tables (everything returned is a fresh copy the caller may keep or edit; a
catalog's model is the catalog's, read-only when the catalog is shared: fleet.catalog).
Everything here reads models, profiles and catalogs only, so they may be read-only views.
]]

local gg = require "gpuguard"
local k8s = require "k8s"
local args = require "args"

local M = {}

local null = gg.null
local MIB = 1024 * 1024
local GIB = 1024 * MIB

-- Internal helpers ---------------------------------------------------------------------------

local fail = args.failer("gpu")
local what, show = args.what, args.show
local cfg_fail = args.config_fail


-- Memory in milli-bytes as people write it: "80Gi", "512Mi", otherwise the DecimalSI quantity.
local function fmt_mem(milli)
    if milli % 1000 == 0 then
        local bytes = milli // 1000
        if bytes > 0 and bytes % GIB == 0 then
            return (bytes // GIB) .. "Gi"
        elseif bytes > 0 and bytes % MIB == 0 then
            return (bytes // MIB) .. "Mi"
        end
    end
    return gg.format_quantity(milli, "DecimalSI")
end
M.format_memory = fmt_mem

-- Profile names -------------------------------------------------------------------------------

-- Split "<G>g.<M>gb<suffix>" into G, M (integers) and the suffix ("" or "+me", "+me.all",
-- "+gfx", "-me"); nil when name is not a MIG profile name.
local function parse_profile_name(name)
    if type(name) ~= "string" then
        return nil
    end
    local g, m, rest = name:match("^(%d+)g%.(%d+)gb(.*)$")
    if not g or #g > 2 or #m > 4 then
        return nil
    end
    if rest ~= "" and not rest:match("^[%+%-]%a[%w%.]*$") then
        return nil
    end
    g, m = tonumber(g), tonumber(m)
    if g < 1 then
        return nil
    end
    return g, m, rest
end

-- The attribute suffixes of the MIG User Guide: media extensions, all media engines, graphics
-- (GB20X), no media engines.
local SUFFIXES = { [""] = true, ["+me"] = true, ["+me.all"] = true, ["+gfx"] = true,
                   ["-me"] = true }

-- True for the media-extension profiles: "+me" and "+me.all".
local function is_me(suffix)
    return suffix == "+me" or suffix == "+me.all"
end

-- The GFD product-name sanitiser (k8s-device-plugin internal/lm/resource.go sanitise):
-- characters outside [A-Za-z0-9-_. ] are removed, runs of blanks become "-".
local function sanitise(s)
    s = s:gsub("[^%w%-_%. ]", "")
    local words = {}
    for w in s:gmatch("%S+") do
        words[#words + 1] = w
    end
    return table.concat(words, "-")
end

-- Lookup key of a model name: lower case, blanks and "_" as "-".
local function norm(name)
    return (name:lower():gsub("[%s_]+", "-"):gsub("^%-+", ""):gsub("%-+$", ""))
end

-- The built-in catalog ------------------------------------------------------------------------
--
-- Profiles: { name, max instances per GPU, memory slices (eighths; quarters on A30),
--             usable GiB from nvidia-smi as the reference quotes it (or nil),
--             driver = minimum driver branch when the guide gives one }.
-- Family: GFD nvidia.com/gpu.family (the architecture).
-- Products: GFD nvidia.com/gpu.product values of the whole GPU (NVML name, blanks as "-"); the
-- first is the default for MIG product labels.  "NVIDIA-H100-80GB-HBM3", "NVIDIA-H100-NVL" and
-- "Tesla-T4" are quoted in the reference; the others follow NVML's device names of current
-- drivers and were not checked against a node.  Older drivers named GPUs without "NVIDIA "
-- ("A100-SXM4-40GB", as in the GFD README's "A100-SXM4-40GB-MIG-1g.5gb"): such names are
-- found too (lookups ignore a leading "NVIDIA-"), and labels in that form need the product
-- argument of mig_product_label.

-- Hopper/Blackwell 7-slice layout: 1g ×7, 1g+me ×1, double-memory 1g ×4, 2g ×3, 3g ×2, 4g ×1,
-- 7g ×1; mem = the GB figures of the seven names.
local function seven(g1, g1x2, g2, g3, g4, g7, usable)
    usable = usable or {}
    return {
        { "1g." .. g1 .. "gb", 7, 1, usable[1] },
        { "1g." .. g1 .. "gb+me", 1, 1, usable[1] },
        { "1g." .. g1x2 .. "gb", 4, 2, usable[2] },
        { "2g." .. g2 .. "gb", 3, 2, usable[2] },
        { "3g." .. g3 .. "gb", 2, 4, usable[3] },
        { "4g." .. g4 .. "gb", 1, 4, usable[3] },
        { "7g." .. g7 .. "gb", 1, 8, usable[4] },
    }
end

local BUILTIN = {
    {
        name = "A30-24GB", family = "ampere", memory_gb = 24, slices = 4, memory_slices = 4,
        products = { "NVIDIA-A30" },
        aliases = { "A30", "A30-PCIE-24GB" },
        profiles = {
            { "1g.6gb", 4, 1 },
            { "1g.6gb+me", 1, 1, driver = "R470" },
            { "2g.12gb", 2, 2 },
            { "2g.12gb+me", 1, 2, driver = "R525" },
            { "4g.24gb", 1, 4 },
        },
    },
    {
        name = "A100-40GB", family = "ampere", memory_gb = 40, slices = 7, memory_slices = 8,
        products = { "NVIDIA-A100-SXM4-40GB", "NVIDIA-A100-PCIE-40GB" },
        aliases = { "A100-40GB-PCIe", "A100-40GB-SXM4", "A800-40GB", "A800-SXM4-40GB" },
        profiles = {
            { "1g.5gb", 7, 1, "4.75" },
            { "1g.5gb+me", 1, 1, "4.75", driver = "R470" },
            -- The guide prints 1/8 of memory here; the name, nvidia-smi and the H100 analogue
            -- say 2/8 (reference §2: a doc typo).
            { "1g.10gb", 4, 2, "9.62", driver = "R525" },
            { "2g.10gb", 3, 2, "9.62" },
            { "3g.20gb", 2, 4, "19.50" },
            { "4g.20gb", 1, 4, "19.50" },
            { "7g.40gb", 1, 8, "39.25" },
        },
    },
    {
        name = "A100-80GB", family = "ampere", memory_gb = 80, slices = 7, memory_slices = 8,
        products = { "NVIDIA-A100-SXM4-80GB", "NVIDIA-A100-80GB-PCIe" },
        aliases = { "A100-PCIE-80GB", "A100-80GB-SXM4", "A800-80GB", "A800-SXM4-80GB",
                    "A800-80GB-PCIe" },
        profiles = seven(10, 20, 20, 40, 40, 80),
    },
    {
        name = "H100-80GB", family = "hopper", memory_gb = 80, slices = 7, memory_slices = 8,
        products = { "NVIDIA-H100-80GB-HBM3", "NVIDIA-H100-PCIe" },
        aliases = { "H100-SXM5-80GB", "H100-PCIe-80GB", "H100-80GB-PCIe", "H100-SXM",
                    "H100-PCIe", "H800-80GB", "H800-SXM5-80GB", "H800-PCIe-80GB" },
        profiles = seven(10, 20, 20, 40, 40, 80, { "9.75", "19.62", "39.50", "79.25" }),
    },
    {
        name = "H100-94GB", family = "hopper", memory_gb = 94, slices = 7, memory_slices = 8,
        products = { "NVIDIA-H100-NVL" },
        aliases = { "H100-NVL", "H100-NVL-94GB", "H100-SXM5-94GB", "H100-PCIe-94GB",
                    "H800-NVL" },
        profiles = seven(12, 24, 24, 47, 47, 94, { "10.75", "21.62", "46.38", "93.12" }),
    },
    {
        name = "H100-96GB", family = "hopper", memory_gb = 96, slices = 7, memory_slices = 8,
        note = "the H100 of GH200 480GB (96GB HBM3); the guide lists H20 (96GB) with the "
            .. "same profiles",
        products = { "NVIDIA-GH200-480GB", "NVIDIA-H20" },
        aliases = { "GH200-96GB", "GH200-480GB", "H20", "H20-96GB", "PG506-96GB" },
        profiles = seven(12, 24, 24, 48, 48, 96),
    },
    {
        name = "H200-141GB", family = "hopper", memory_gb = 141, slices = 7, memory_slices = 8,
        products = { "NVIDIA-H200", "NVIDIA-H200-NVL" },
        aliases = { "H200", "H200-SXM5-141GB", "H200-NVL", "H200-NVL-141GB" },
        profiles = seven(18, 35, 35, 71, 71, 141),
    },
    {
        name = "B200-180GB", family = "blackwell", memory_gb = 180, slices = 7, memory_slices = 8,
        products = { "NVIDIA-B200" },
        aliases = { "B200", "B200-SXM6-180GB" },
        profiles = seven(23, 45, 45, 90, 90, 180),
    },
    {
        name = "GH200-144GB", family = "hopper", memory_gb = 144, slices = 7, memory_slices = 8, uncertain = true,
        note = "not in the MIG User Guide's tables: profiles and counts from the GPU "
            .. "Operator's default mig-parted config, memory fractions assumed to follow Hopper",
        products = { "NVIDIA-GH200-144G-HBM3e" },
        aliases = { "GH200-144G", "GH200-144G-HBM3e" },
        profiles = seven(18, 36, 36, 72, 72, 144),
    },
    {
        name = "GB200-186GB", family = "blackwell", memory_gb = 186, slices = 7, memory_slices = 8, uncertain = true,
        note = "listed by the MIG User Guide (7 instances) without a profile table: profiles "
            .. "and counts from the GPU Operator's default mig-parted config; that config also "
            .. "names a 7g.189gb profile without saying for which GPU",
        products = { "NVIDIA-GB200" },
        aliases = { "GB200", "GB200-HGX" },
        profiles = seven(23, 47, 47, 93, 93, 186),
    },
    { name = "L4", family = "ada-lovelace", memory_gb = 24, products = { "NVIDIA-L4" },
      aliases = { "L4-24GB" } },
    { name = "L40S", family = "ada-lovelace", memory_gb = 48, products = { "NVIDIA-L40S" },
      aliases = { "L40S-48GB" } },
    { name = "A10", family = "ampere", memory_gb = 24, products = { "NVIDIA-A10" },
      aliases = { "A10-24GB" } },
    { name = "T4", family = "turing", memory_gb = 16, products = { "Tesla-T4" },
      aliases = { "T4-16GB", "NVIDIA-T4" } },
}

-- Names that could mean more than one built-in model: an error that lists the candidates.
local AMBIGUOUS = {
    ["a100"] = { "A100-40GB", "A100-80GB" },
    ["a800"] = { "A100-40GB", "A100-80GB" },
    ["h100"] = { "H100-80GB", "H100-94GB", "H100-96GB" },
    ["h800"] = { "H100-80GB", "H100-94GB" },
    ["gh200"] = { "H100-96GB", "GH200-144GB" },
}

-- usable GiB "9.62" -> MiB, rounded down: floor(962 * 1024 / 100) = 9850.
local function usable_mib(gib)
    local whole, frac = gib:match("^(%d+)%.(%d%d)$")
    return (tonumber(whole) * 100 + tonumber(frac)) * 1024 // 100
end

-- A profile table: name, slices, memory, max, me, suffix, resource and the usable figures.
local function make_profile(model_slices, name, memory_milli, max, extra)
    local g, _, suffix = parse_profile_name(name)
    local p = {
        name = name,
        slices = g,
        memory_mib = memory_milli // 1000 // MIB,
        memory_milli = memory_milli,
        max = max,
        me = is_me(suffix),
        suffix = suffix,
        resource = "nvidia.com/mig-" .. name:gsub("%+", "."),
        charge_milli = (g * 1000 + model_slices - 1) // model_slices,
    }
    for k, v in pairs(extra or {}) do
        p[k] = v
    end
    return p
end

local function profile_order(a, b)
    if a.slices ~= b.slices then
        return a.slices < b.slices
    elseif a.memory_milli ~= b.memory_milli then
        return a.memory_milli < b.memory_milli
    elseif (a.suffix == "") ~= (b.suffix == "") then
        return a.suffix == ""
    end
    return a.name < b.name
end

local function builtin_model(row)
    local m = {
        name = row.name,
        family = row.family,
        memory_mib = row.memory_gb * 1024,
        memory_milli = row.memory_gb * GIB * 1000,
        slices = row.slices,
        memory_slices = row.memory_slices,
        mig = row.profiles ~= nil,
        uncertain = row.uncertain or false,
        note = row.note,
        builtin = true,
        products = row.products,
        product = row.products[1],
        aliases = row.aliases,
        profiles = {},
    }
    for _, r in ipairs(row.profiles or {}) do
        local _, gb = parse_profile_name(r[1])
        local extra = { memory_slices = r[3], driver = r.driver }
        if r[4] then
            extra.usable_gib = r[4]
            extra.usable_mib = usable_mib(r[4])
            extra.usable_milli = extra.usable_mib * MIB * 1000
        end
        m.profiles[#m.profiles + 1] = make_profile(row.slices, r[1], gb * GIB * 1000, r[2], extra)
    end
    table.sort(m.profiles, profile_order)
    return m
end

-- Copies: everything handed out is the caller's own.

local function copy_list(l)
    local out = {}
    for i, v in ipairs(l or {}) do
        out[i] = v
    end
    return out
end

-- Field by field (every field make_profile and cfg_profile set): a constructor sizes the table
-- once, where a pairs loop calls next per field and grows the table four times.
local function copy_profile(p)
    return {
        name = p.name, slices = p.slices, memory_mib = p.memory_mib,
        memory_milli = p.memory_milli, max = p.max, me = p.me, suffix = p.suffix,
        resource = p.resource, charge_milli = p.charge_milli, memory_slices = p.memory_slices,
        driver = p.driver, usable_gib = p.usable_gib, usable_mib = p.usable_mib,
        usable_milli = p.usable_milli,
    }
end

local function copy_model(m)
    local out = {}
    for k, v in pairs(m) do
        out[k] = v
    end
    out.products, out.aliases = copy_list(m.products), copy_list(m.aliases)
    out.profiles = {}
    for i, p in ipairs(m.profiles) do
        out.profiles[i] = copy_profile(p)
    end
    return out
end

-- key without a leading "nvidia-" or "tesla-" (GFD products of current and older drivers).
local PRODUCT_PREFIXES = { "nvidia-", "tesla-" }
local function unprefixed(key)
    for _, prefix in ipairs(PRODUCT_PREFIXES) do
        if key:sub(1, #prefix) == prefix and #key > #prefix then
            return key:sub(#prefix + 1)
        end
    end
    return key
end

-- Lookup keys of a model: its name, aliases and products, each also without "NVIDIA-".
local function model_keys(m)
    local keys = {}
    for _, list in ipairs({ { m.name }, m.aliases, m.products }) do
        for _, a in ipairs(list) do
            keys[#keys + 1] = norm(a)
            keys[#keys + 1] = unprefixed(norm(a))
        end
    end
    return keys
end

-- A catalog: models by canonical name, the names in order, lookup keys, ambiguous names.
local function new_catalog()
    return { models = {}, names = {}, keys = {}, ambiguous = {} }
end

local function add_keys(cat, m)
    for _, k in ipairs(model_keys(m)) do
        cat.keys[k] = m.name
    end
end

local BUILT = new_catalog()
for _, row in ipairs(BUILTIN) do
    local m = builtin_model(row)
    BUILT.models[m.name] = m
    BUILT.names[#BUILT.names + 1] = m.name
    add_keys(BUILT, m)
end
for k, v in pairs(AMBIGUOUS) do
    BUILT.ambiguous[k] = v
end

-- What a name means in cat: the canonical name of its model, or nil and the candidates of an
-- ambiguous name, or nothing.
local function meaning(cat, name)
    local key = norm(name)
    -- GFD product label values: "<product>-MIG-<profile>" (single strategy), "<product>-SHARED".
    key = key:gsub("%-mig%-%d+g%..*$", ""):gsub("%-shared$", "")
    local tries = { key, unprefixed(key) }
    for _, k in ipairs(tries) do
        local canonical = cat.keys[k]
        if canonical then
            return canonical
        end
    end
    for _, k in ipairs(tries) do
        local choices = cat.ambiguous[k]
        if choices then
            return nil, choices
        end
    end
    return nil
end

-- The model a name means in cat (raw, not copied), or nil and a message.
local function lookup(cat, name)
    local canonical, choices = meaning(cat, name)
    if canonical then
        return cat.models[canonical]
    elseif choices then
        return nil, string.format("GPU model %s is ambiguous: it may be %s; name the memory "
                                  .. "size, such as %s", show(name),
                                  table.concat(choices, " or "), choices[#choices])
    end
    return nil, string.format("unknown GPU model %s; known models: %s (add others under "
                              .. "gpu_models in the configuration)", show(name),
                              table.concat(cat.names, ", "))
end

-- The model meant by model (a model table, or a name looked up in the built-in catalog); raw.
local function resolve(lvl, fname, model)
    if type(model) == "table" then
        if type(model.name) ~= "string" or type(model.profiles) ~= "table" then
            fail(lvl + 1, fname, "model must be a model from gpu.model or gpu.catalog, or a "
                 .. "model name, got a table without name and profiles")
        end
        return model
    elseif type(model) ~= "string" or model == "" then
        fail(lvl + 1, fname, "model must be a model name such as \"A100-80GB\" or a model "
             .. "table, got %s", what(model))
    end
    return lookup(BUILT, model)
end

-- The profile of m named name (raw), or nil and a message listing m's profiles.
local function find_profile(m, name)
    local profiles = m.profiles
    for i = 1, #profiles do -- ipairs written out (a C call per step); the list has no gaps
        if profiles[i].name == name then
            return profiles[i]
        end
    end
    if #m.profiles == 0 then
        return nil, string.format("GPU model %s has no MIG profiles (it does not support MIG)",
                                  m.name)
    end
    local names = {}
    for i, p in ipairs(m.profiles) do
        names[i] = p.name
    end
    return nil, string.format("GPU model %s has no MIG profile %s; its profiles are %s",
                              m.name, show(name), table.concat(names, ", "))
end

local function profile_name_arg(lvl, fname, profile)
    if type(profile) == "table" and type(profile.name) == "string" then
        return profile.name
    elseif type(profile) ~= "string" then
        fail(lvl + 1, fname, "profile must be a MIG profile name such as \"1g.10gb\" or a "
             .. "profile table, got %s", what(profile))
    end
    return profile
end

-- The model meant by model (raw) and its profile named by profile (a name or a profile table);
-- nil and a message for an unknown model or profile.
local function model_profile(lvl, fname, model, profile)
    local m, err = resolve(lvl + 1, fname, model)
    if not m then
        return nil, err
    end
    local p
    p, err = find_profile(m, profile_name_arg(lvl + 1, fname, profile))
    if not p then
        return nil, err
    end
    return m, p
end

-- Configuration ---------------------------------------------------------------------------------

-- True for a list (a YAML sequence, or a Lua table with keys 1..n).
local function is_list(v)
    if type(v) ~= "table" or gg.is_object(v) then
        return false
    end
    if gg.is_array(v) then
        return true
    end
    local n = 0
    for k in pairs(v) do
        if math.type(k) ~= "integer" then
            return false
        end
        n = n + 1
    end
    return n == #v
end

local function is_mapping(v)
    return type(v) == "table" and not gg.is_array(v) and (gg.is_object(v) or not is_list(v)
        or #v == 0)
end

-- A quantity string at path, in milli-units, at least 1Mi.
local function cfg_memory(path, v, example)
    if type(v) ~= "string" then
        cfg_fail(path, "must be a quantity such as %s, got %s", example, show(v))
    end
    local milli = gg.quantity(v)
    if not milli then
        cfg_fail(path, "must be a quantity such as %s, got %s", example, show(v))
    elseif milli < MIB * 1000 then
        cfg_fail(path, "%s is less than 1Mi; write the unit, such as %s", show(v), example)
    end
    return milli
end

local function cfg_int(path, v, lo, hi)
    if math.type(v) ~= "integer" or v < lo or v > hi then
        cfg_fail(path, "must be a whole number from %d to %d, got %s", lo, hi,
                 show(v))
    end
    return v
end

local function cfg_strings(path, v)
    if v == nil then
        return {}
    elseif not is_list(v) then
        cfg_fail(path, "must be a list of names, got %s", show(v))
    end
    local out = {}
    for i, s in ipairs(v) do
        if type(s) ~= "string" or s:match("^%s*$") then
            cfg_fail(path .. "[" .. i .. "]", "must be a non-empty string, got %s", show(s))
        end
        out[i] = s
    end
    return out
end


local function cfg_profile(path, e, m)
    if not is_mapping(e) then
        cfg_fail(path, "must be a mapping with a name such as 1g.12gb, got %s", show(e))
    end
    local g, gb, suffix = parse_profile_name(e.name)
    if not g then
        cfg_fail(path .. ".name", "must be a MIG profile name such as 1g.12gb or 1g.12gb+me, "
                 .. "got %s", show(e.name))
    end
    if g > m.slices then
        cfg_fail(path .. ".name", "%s has %d compute slices, more than the GPU's %d", e.name, g,
                 m.slices)
    end
    if not SUFFIXES[suffix] then
        cfg_fail(path .. ".name", "%s: unknown attribute %s (known: +me, +me.all, +gfx, -me)",
                 e.name, suffix)
    end
    if e.slices ~= nil and e.slices ~= g then
        cfg_fail(path .. ".slices", "must be %d as the name %s says, got %s", g, e.name,
                 show(e.slices))
    end
    local memory
    if e.memory ~= nil then
        memory = cfg_memory(path .. ".memory", e.memory, gb > 0 and gb .. "Gi" or "10Gi")
    elseif gb > 0 then
        memory = gb * GIB * 1000
    else
        cfg_fail(path .. ".memory", "must be given: the name %s says 0gb", e.name)
    end
    if memory > m.memory_milli then
        cfg_fail(path .. ".memory", "%s is more than the GPU's %s", fmt_mem(memory),
                 fmt_mem(m.memory_milli))
    end
    local max = e.max == nil and (suffix == "" and m.slices // g or 1)
        or cfg_int(path .. ".max", e.max, 1, 64)
    local extra = {}
    if e.usable ~= nil then
        extra.usable_milli = cfg_memory(path .. ".usable", e.usable, "9750Mi")
        extra.usable_mib = extra.usable_milli // 1000 // MIB
        if extra.usable_milli > memory then
            cfg_fail(path .. ".usable", "%s is more than the profile's %s", show(e.usable),
                     fmt_mem(memory))
        end
    end
    local p = make_profile(m.slices, e.name, memory, max, extra)
    if e.me ~= nil then
        if type(e.me) ~= "boolean" then
            cfg_fail(path .. ".me", "must be true or false, got %s", show(e.me))
        end
        p.me = e.me
    end
    return p
end

-- A model from configuration entry e at path ("gpu_models[2]").
local function cfg_model(path, e)
    if not is_mapping(e) then
        cfg_fail(path, "must be a mapping with name and memory, got %s", show(e))
    end
    if type(e.name) ~= "string" or not e.name:match("^[%w][%w%.%-_ ]*$") then
        cfg_fail(path .. ".name", "must be a model name of letters, digits, '.', '-' and '_', "
                 .. "such as RTX-PRO-6000-96GB, got %s", show(e.name))
    end
    local m = {
        name = e.name,
        memory_milli = cfg_memory(path .. ".memory", e.memory, "48Gi"),
        uncertain = false,
        builtin = false,
        aliases = cfg_strings(path .. ".aliases", e.aliases),
        products = cfg_strings(path .. ".products", e.products),
        profiles = {},
    }
    m.memory_mib = m.memory_milli // 1000 // MIB
    if e.uncertain ~= nil then
        if type(e.uncertain) ~= "boolean" then
            cfg_fail(path .. ".uncertain", "must be true or false, got %s", show(e.uncertain))
        end
        m.uncertain = e.uncertain
    end
    if e.family ~= nil then
        if type(e.family) ~= "string" or not e.family:match("^[a-z][-a-z0-9]*$") then
            cfg_fail(path .. ".family", "must be the nvidia.com/gpu.family label value, such as "
                     .. "hopper or ada-lovelace, got %s", show(e.family))
        end
        m.family = e.family
    end
    if e.note ~= nil then
        if type(e.note) ~= "string" then
            cfg_fail(path .. ".note", "must be a string, got %s", show(e.note))
        end
        m.note = e.note
    end
    if e.profiles ~= nil and not is_list(e.profiles) then
        cfg_fail(path .. ".profiles", "must be a list of MIG profiles, got %s", show(e.profiles))
    end
    local profiles = e.profiles or {}
    if e.slices ~= nil then
        m.slices = cfg_int(path .. ".slices", e.slices, 1, 8)
    else
        -- The largest profile's compute slices (7g.96gb: 7); cfg_profile reports bad entries.
        for _, p in ipairs(profiles) do
            local g = is_mapping(p) and parse_profile_name(p.name)
            if g then
                m.slices = math.max(m.slices or 0, math.min(g, 8))
            end
        end
        m.slices = m.slices or 8
    end
    m.mig = #profiles > 0
    local seen = {}
    for i, p in ipairs(profiles) do
        local pp = path .. ".profiles[" .. i .. "]"
        local prof = cfg_profile(pp, p, m)
        if seen[prof.name] then
            cfg_fail(pp .. ".name", "%s is already %s", prof.name, seen[prof.name])
        end
        seen[prof.name] = pp
        m.profiles[#m.profiles + 1] = prof
    end
    table.sort(m.profiles, profile_order)
    if m.mig then
        m.memory_slices = 8
    end
    m.product = m.products[1] or sanitise(m.name)
    return m
end

-- Public API: the catalog ---------------------------------------------------------------------

--- The GPU catalog: the built-in models merged with cfg.gpu_models (cfg may be nil).  Returns
--- a fresh table { models = {[canonical name] = model}, names = {canonical names in order},
--- keys = {...}, ambiguous = {...} } for gpu.model(name, catalog).  A configured model whose
--- name is a built-in canonical name (any case) replaces the built-in one (keeping its aliases);
--- any other must not clash with a known name, alias or product.  A wrong entry raises
--- error(msg, 0) with its key path: "gpu_models[2].profiles[1].memory: must be a quantity ...".
function M.catalog(cfg)
    local cat = new_catalog()
    for _, name in ipairs(BUILT.names) do
        cat.models[name] = copy_model(BUILT.models[name])
        cat.names[#cat.names + 1] = name
    end
    for k, v in pairs(BUILT.keys) do
        cat.keys[k] = v
    end
    for k, v in pairs(BUILT.ambiguous) do
        cat.ambiguous[k] = copy_list(v)
    end
    if cfg == nil then
        return cat
    elseif type(cfg) ~= "table" then
        fail(2, "catalog", "cfg must be the configuration table, got %s", what(cfg))
    elseif cfg.gpu_models == nil or cfg.gpu_models == gg.null then
        return cat
    end
    local list = cfg.gpu_models
    if not is_list(list) then
        cfg_fail("gpu_models", "must be a list of GPU models ({name, memory, slices, "
                 .. "profiles}), got %s", show(list))
    end
    local from_cfg = {} -- canonical name -> path of the entry that defined it
    for i, e in ipairs(list) do
        local path = "gpu_models[" .. i .. "]"
        local m = cfg_model(path, e)
        local replaced = BUILT.keys[norm(m.name)]
        if replaced and BUILT.models[replaced] and norm(replaced) == norm(m.name) then
            local old = cat.models[replaced]
            if from_cfg[replaced] then
                cfg_fail(path .. ".name", "%s is already %s", show(e.name), from_cfg[replaced])
            end
            m.name = replaced
            local aliases = copy_list(old.aliases)
            for _, a in ipairs(m.aliases) do
                aliases[#aliases + 1] = a
            end
            m.aliases = aliases
            if #m.products == 0 then
                m.products, m.product = copy_list(old.products), old.product
            end
            m.family = m.family or old.family
            cat.models[replaced] = m
        else
            local key = norm(m.name)
            if cat.keys[key] then
                local other = cat.keys[key]
                if from_cfg[other] then
                    cfg_fail(path .. ".name", "%s is already %s", show(e.name), from_cfg[other])
                end
                cfg_fail(path .. ".name", "%s already names the built-in model %s; use name: "
                         .. "%s to replace it", show(e.name), other, other)
            end
            cat.models[m.name] = m
            cat.names[#cat.names + 1] = m.name
        end
        from_cfg[m.name] = path
        for _, fl in ipairs({ { "aliases", e.aliases }, { "products", e.products } }) do
            local field = fl[1]
            for j, a in ipairs(cfg_strings(path .. "." .. field, fl[2])) do
                local other = cat.keys[norm(a)]
                if other and other ~= m.name then
                    cfg_fail(path .. "." .. field .. "[" .. j .. "]", "%s already names %s",
                             show(a), other)
                end
            end
        end
        for _, k in ipairs(model_keys(m)) do
            cat.keys[k] = m.name
            cat.ambiguous[k] = nil
        end
    end
    return cat
end

--- The model that name means: canonical names, aliases and GFD product names, case-insensitive
--- ("a100-sxm4-80gb", "NVIDIA A100-SXM4-80GB", "NVIDIA-A100-SXM4-80GB-MIG-1g.10gb" all give
--- A100-80GB), looked up in catalog (from gpu.catalog) or the built-in catalog.  Returns the
--- model table (a copy for the built-in catalog; catalog's own table otherwise, read-only for
--- the shared catalog of fleet.catalog), or nil and a message ("unknown GPU model ...", "GPU
--- model "A100" is ambiguous ...").
function M.model(name, catalog)
    if type(name) ~= "string" or name == "" then
        fail(2, "model", "name must be a model name such as \"A100-80GB\", got %s", what(name))
    end
    if catalog ~= nil then
        if type(catalog) ~= "table" or type(catalog.keys) ~= "table" then
            fail(2, "model", "catalog must come from gpu.catalog(cfg), got %s", what(catalog))
        end
        return lookup(catalog, name)
    end
    local m, err = lookup(BUILT, name)
    if not m then
        return nil, err
    end
    return copy_model(m)
end

--- The canonical names of the models name may mean in catalog (from gpu.catalog): the one of
--- a known name, alias or product, every candidate of an ambiguous name ("A100": A100-40GB and
--- A100-80GB), none for an unknown name.  A fresh list.
function M.models_named(name, catalog)
    if type(name) ~= "string" or type(catalog) ~= "table" or type(catalog.keys) ~= "table" then
        fail(2, "models_named", "takes a model name and a catalog from gpu.catalog(cfg), got %s "
             .. "and %s", what(name), what(catalog))
    end
    local canonical, choices = meaning(catalog, name)
    if canonical then
        return { canonical }
    end
    return copy_list(choices or {})
end

--- The profile of model (a model table or name) named name, as a fresh table; nil and a message
--- naming the model's profiles when it has none of that name.
function M.profile(model, name)
    local m, p = model_profile(2, "profile", model, name)
    if not m then
        return nil, p
    end
    return copy_profile(p)
end

-- Public API: MIG -----------------------------------------------------------------------------

--- Parse a MIG profile name: "2g.20gb" -> 2, 20, ""; "1g.10gb+me" -> 1, 10, "+me"; nil when it
--- is not a profile name.  (compute slices, the GB figure of the name, the attribute suffix)
function M.parse_profile(name)
    return parse_profile_name(name)
end

-- The memory of profile p that a request is held against: the usable figure when usable.
local function memory_of(p, usable)
    return usable and p.usable_milli or p.memory_milli
end

--- The smallest MIG profile of model that covers want = { memory_milli = bytes*1000 or nil,
--- fraction_milli = 0..1000 or nil, allow_me = false, usable = false }: fewest compute slices,
--- then least memory, among profiles with at least want.memory_milli of memory (nominal memory,
--- or the usable figure where known when want.usable) and at least ceil(fraction_milli *
--- slices / 1000) compute slices.  Profiles with an attribute suffix are never picked, except
--- "+me" ones when want.allow_me.  Returns a fresh profile table (with model = the model's
--- name), or nil and a message: "no MIG profile of A100-80GB has 90Gi of memory; the largest
--- is 7g.80gb (80Gi)".
function M.pick_profile(model, want)
    local f = "pick_profile"
    local m, err = resolve(2, f, model)
    if not m then
        return nil, err
    end
    want = want or {}
    if type(want) ~= "table" then
        fail(2, f, "want must be a table such as {memory_milli = ...}, got %s", what(want))
    end
    local mem, frac = want.memory_milli, want.fraction_milli
    if mem ~= nil and (math.type(mem) ~= "integer" or mem < 0) then
        fail(2, f, "want.memory_milli must be a non-negative integer (bytes * 1000, as "
             .. "gg.quantity gives), got %s", what(mem))
    end
    if frac ~= nil and (math.type(frac) ~= "integer" or frac < 0 or frac > 1000) then
        fail(2, f, "want.fraction_milli must be an integer from 0 to 1000, got %s",
             what(frac))
    end
    if #m.profiles == 0 then
        return nil, string.format("GPU model %s has no MIG profiles (it does not support MIG)",
                                  m.name)
    end
    local need = frac and (frac * m.slices + 999) // 1000 or 0
    local usable, allow_me = want.usable, want.allow_me
    local best
    local profiles = m.profiles
    for i = 1, #profiles do -- ipairs written out (a C call per step); the list has no gaps
        local p = profiles[i]
        if (p.suffix == "" or (allow_me and p.me))
            and (mem == nil or memory_of(p, usable) >= mem)
            and p.slices >= need and (best == nil or profile_order(p, best)) then
            best = p
        end
    end
    if best then
        local out = copy_profile(best)
        out.model = m.name
        return out
    end
    -- Nothing fits: the largest candidate, for the message (a second pass only here).
    local largest
    for _, p in ipairs(m.profiles) do
        if (p.suffix == "" or (allow_me and p.me))
            and (largest == nil or profile_order(largest, p)) then
            largest = p
        end
    end
    if largest == nil then
        return nil, string.format("GPU model %s has no MIG profile without attributes (+me, "
                                  .. "+gfx, ...) to pick from", m.name)
    end
    local memword = want.usable and "usable memory" or "memory"
    local asks, has = {}, {}
    if mem ~= nil and memory_of(largest, usable) < mem then
        asks[#asks + 1] = fmt_mem(mem) .. " of " .. memword
        has[#has + 1] = want.usable and largest.usable_gib and largest.usable_gib .. "Gi usable"
            or fmt_mem(memory_of(largest, usable))
    end
    if largest.slices < need then
        asks[#asks + 1] = string.format("%d of %d compute slices", need, m.slices)
        has[#has + 1] = largest.slices .. (largest.slices == 1 and " slice" or " slices")
    end
    return nil, string.format("no MIG profile of %s has %s; the largest is %s (%s)", m.name,
                              table.concat(asks, " and "), largest.name,
                              table.concat(has, ", "))
end

--- The extended resource of a MIG profile under the mixed strategy: "nvidia.com/mig-" .. name
--- with "+" written "." (the device plugin's rule): "1g.10gb" -> "nvidia.com/mig-1g.10gb",
--- "1g.10gb+me" -> "nvidia.com/mig-1g.10gb.me".  profile is a name or a profile table.
function M.mig_resource(profile)
    local name = profile_name_arg(2, "mig_resource", profile)
    if not parse_profile_name(name) then
        fail(2, "mig_resource", "%s is not a MIG profile name such as 1g.10gb or 1g.10gb+me",
             show(name))
    end
    return "nvidia.com/mig-" .. name:gsub("%+", ".")
end

--- The MIG profile name of a mixed-strategy resource: "nvidia.com/mig-1g.10gb.me" ->
--- "1g.10gb+me", and whether it is a shared (".shared", time-sliced) resource; nil when
--- resource is not a MIG resource (attributes other than the guide's +me, +me.all, +gfx and
--- -me are not recognised).
function M.mig_profile_of(resource)
    if type(resource) ~= "string" then
        return nil
    end
    local rest = resource:match("^nvidia%.com/mig%-(.+)$")
    if not rest then
        return nil
    end
    local shared = false
    if rest:sub(-7) == ".shared" then
        rest, shared = rest:sub(1, -8), true
    end
    local base, attrs = rest:match("^(%d+g%.%d+gb)(.*)$")
    if not base then
        return nil
    end
    if attrs:sub(1, 1) == "." then
        attrs = "+" .. attrs:sub(2)
    end
    local name = base .. attrs
    if not parse_profile_name(name) or not SUFFIXES[attrs] then
        return nil
    end
    return name, shared
end

--- The GFD product label (nvidia.com/gpu.product) of a node whose GPUs of model are split into
--- profile under the single strategy: "<whole-GPU product>-MIG-<profile>", each part through
--- GFD's sanitiser (so "+" is dropped: "1g.10gb+me" gives "...-MIG-1g.10gbme").  The product
--- is the optional product argument, else model itself when it is a string naming one of the
--- model's products ("NVIDIA-A100-80GB-PCIe"), else the model's default product
--- ("A100-80GB" -> "NVIDIA-A100-SXM4-80GB-MIG-1g.10gb").  nil and a message for an unknown
--- model or a profile the model does not have.
function M.mig_product_label(model, profile, product)
    local f = "mig_product_label"
    local m, p = model_profile(2, f, model, profile)
    if not m then
        return nil, p
    end
    if product ~= nil and (type(product) ~= "string" or product == "") then
        fail(2, f, "product must be a GFD product name such as \"NVIDIA-A100-SXM4-80GB\", "
             .. "got %s", what(product))
    end
    if product == nil and type(model) == "string" then
        for _, candidate in ipairs(m.products) do
            if unprefixed(norm(candidate)) == unprefixed(norm(model)) then
                product = candidate
            end
        end
    end
    return sanitise(product or m.product) .. "-MIG-" .. sanitise(p.name)
end

-- Public API: charges -------------------------------------------------------------------------

--- The charge of one MIG device in milli-GPU: its compute fraction rounded up,
--- ceil(slices * 1000 / model slices): 1g of 7 = 143, 3g of 7 = 429, 2g of 4 = 500.  nil and
--- a message for an unknown model or profile.
function M.charge_milli(model, profile)
    local m, p = model_profile(2, "charge_milli", model, profile)
    if not m then
        return nil, p
    end
    return (p.slices * 1000 + m.slices - 1) // m.slices
end

--- The charge of n whole GPUs in milli-GPU: n * 1000.
function M.whole_charge(n)
    if math.type(n) ~= "integer" or n < 0 then
        fail(2, "whole_charge", "n must be a non-negative integer, got %s", what(n))
    end
    return n * 1000
end

-- Public API: what a container asks for -------------------------------------------------------

-- Resources of sharing backends that are not NVIDIA device-plugin devices:
-- resource -> kind, unit.
local OTHER = {
    ["nvidia.com/gpumem"] = { "hami", "MiB" },
    ["nvidia.com/gpumem-percentage"] = { "hami", "percent" },
    ["nvidia.com/gpucores"] = { "hami", "percent" },
    ["volcano.sh/vgpu-number"] = { "volcano", "devices" },
    ["volcano.sh/vgpu-memory"] = { "volcano", "MiB" },
    ["volcano.sh/vgpu-memory-percentage"] = { "volcano", "percent" },
    ["volcano.sh/vgpu-cores"] = { "volcano", "percent" },
    ["volcano.sh/gpu-number"] = { "volcano", "devices" },
    ["volcano.sh/gpu-memory"] = { "volcano", "MiB" },
}

-- The extended resources of the GPU device classes of NVIDIA's DRA driver (KEP-5004, DRA
-- extended resources: a container asks for deviceclass.resource.kubernetes.io/<class>: n and the
-- scheduler makes a claim of n devices of the class for the pod), by name: the class.
local DRA_EXTENDED = {}
for _, class in ipairs({ "gpu.nvidia.com", "mig.nvidia.com", "vfio.gpu.nvidia.com" }) do
    DRA_EXTENDED["deviceclass.resource.kubernetes.io/" .. class] = class
end

-- kind, unit and MIG profile (a DRA device class for kind "dra") of a resource name, or nil when
-- it is not a GPU resource.
local function classify(name)
    if name == "nvidia.com/gpu" then
        return "whole", "devices"
    elseif name == "nvidia.com/gpu.shared" then
        return "shared", "replicas"
    elseif DRA_EXTENDED[name] then
        return "dra", "devices", DRA_EXTENDED[name]
    end
    local profile, shared = M.mig_profile_of(name)
    if profile then
        return shared and "shared" or "mig", shared and "replicas" or "devices", profile
    end
    local o = OTHER[name]
    if o then
        return o[1], o[2]
    end
    return nil
end

-- classify's answer by name, { kind, unit, profile } or false (also for a key that is not a
-- string): every review asks about the same few names ("cpu", "memory", ...), and
-- mig_profile_of runs a pattern on each.  Capped, as the names come from pods: past
-- MAX_CLASSIFIED names, new ones are classified on every call.
local classified, n_classified, MAX_CLASSIFIED = {}, 0, 256

local function class_of(name)
    local c = classified[name]
    if c == nil then
        if type(name) ~= "string" then
            return false
        end
        local kind, unit, profile = classify(name)
        c = kind ~= nil and { kind, unit, profile }
        if n_classified < MAX_CLASSIFIED then
            classified[name] = c
            n_classified = n_classified + 1
        end
    end
    return c
end

-- Add to names the GPU resource names among keys (a section's, gpuguard.fields) that seen
-- lacks; returns names and seen, both made on the first such name.
local function gpu_names(keys, names, seen)
    for i = 1, #keys do
        local name = keys[i]
        if class_of(name) and not (seen and seen[name]) then
            if not names then
                names, seen = {}, {}
            end
            seen[name] = true
            names[#names + 1] = name
        end
    end
    return names, seen
end

--- True when name is a GPU resource that requested() lists (of any kind).
function M.is_gpu_resource(name)
    return class_of(name) ~= false
end

--- The GPU resources container asks for, as a list sorted by resource name of
---   { resource = "nvidia.com/mig-1g.10gb", count = 2, kind = "mig", unit = "devices",
---     profile = "1g.10gb" }
--- kind: "whole" (nvidia.com/gpu), "mig" (nvidia.com/mig-<profile>), "shared"
--- (nvidia.com/gpu.shared, nvidia.com/mig-<profile>.shared; replicas), "hami"
--- (nvidia.com/gpumem in MiB, nvidia.com/gpumem-percentage and nvidia.com/gpucores in percent)
--- "volcano" (volcano.sh/vgpu-*, volcano.sh/gpu-*) or "dra" (deviceclass.resource.kubernetes.io/
--- <class> of NVIDIA's GPU device classes, with class = the device class: devices the scheduler
--- allocates through a claim of its own).  count is the effective request
--- (requests, else limits, as k8s.request_milli) in whole units; zero requests are left out.
--- A quantity that is not a whole number raises an error naming the container.
function M.requested(container)
    local out = {}
    if type(container) ~= "table" then
        return out
    end
    -- The names read without filling the container: most ask for no GPU, and the containers
    -- no policy reads stay untouched (stubs) for the other policies and the diff.
    local names, seen = gpu_names(gg.fields(container, "resources", "limits"))
    names = gpu_names(gg.fields(container, "resources", "requests"), names, seen)
    if not names then
        return out -- no GPU resource, as most containers
    end
    local res = container.resources
    local limits, requests = res.limits, res.requests
    if #names > 1 then
        table.sort(names)
    end
    for _, name in ipairs(names) do
        -- The effective request read from the sections at hand; anything but a quantity string
        -- goes through k8s.request_milli, which converts it or raises its error.
        local v
        if type(requests) == "table" then
            v = requests[name]
        end
        if (v == nil or v == null) and type(limits) == "table" then
            v = limits[name]
        end
        local milli = type(v) == "string" and gg.quantity(v)
        if not milli then
            milli = k8s.request_milli(container, name)
        end
        if milli and milli ~= 0 then
            if milli < 0 or milli % 1000 ~= 0 then
                local cname = type(container.name) == "string" and container.name or "?"
                fail(2, "requested", "container %q: %s = %s must be a whole number", cname,
                     name, gg.format_quantity(milli, "DecimalSI"))
            end
            local c = class_of(name)
            local dra = c[1] == "dra"
            out[#out + 1] = { resource = name, count = milli // 1000, kind = c[1], unit = c[2],
                              profile = not dra and c[3] or nil, class = dra and c[3] or nil }
        end
    end
    return out
end

return M
