--[[
k8s.lua - read and edit Kubernetes objects from gpuguard policies.

Policies get the object under admission as decoded JSON and edit it in place; the engine diffs
the result against the original to build the JSON patch.  This module finds the pod specs in
Pods, built-in controllers and common GPU custom resources, walks containers, and reads and
writes resources, labels, annotations, tolerations, node selectors and environment variables.

Conventions (see lua/README.md for the full reference):
  * A missing field and JSON null (gg.null) are the same thing: readers return nil.
  * Readers never create anything and accept nil where an object is expected.
  * Writers create missing parents as marked JSON objects/arrays, write only when the value
    differs, and return true when they changed the object, false when it already was so; calling
    one twice leaves the object as after once.  Removers return the removed value or nil.
  * Bad arguments raise an error that names the function and the container or field.
Must not: keep state between calls, or write into tables it was not given to edit (config, other
modules).
]]

local gg = require "gpuguard"
local args = require "args"

local M = {}

local null = gg.null

-- Constructors for new JSON values (the engine rejects unmarked empty tables).
M.array = gg.array
M.object = gg.object
M.null = gg.null

--- True when v is nil or JSON null.
function M.is_null(v)
    return v == nil or v == null
end

-- Internal helpers -----------------------------------------------------------------------------
--
-- Helpers that may raise take lvl, as args.lua explains.

local fail = args.failer("k8s")
local what, show = args.what, args.show

-- t[a][b][c] (b and c optional); nil when a step is not a table or the value is JSON null.
-- The hottest function of a request: fixed parameters, as a vararg call costs more.
local function get(t, a, b, c)
    if type(t) ~= "table" then
        return nil
    end
    t = t[a]
    if b ~= nil then
        if type(t) ~= "table" then
            return nil
        end
        t = t[b]
        if c ~= nil then
            if type(t) ~= "table" then
                return nil
            end
            t = t[c]
        end
    end
    if t == null then
        return nil
    end
    return t
end

-- True for a table argument that may also be a read-only proxy (tables from config).
local function is_map(v)
    local t = type(v)
    return t == "table" or (t == "userdata" and v ~= null)
end

local function is_empty(t)
    for _ in pairs(t) do
        return false
    end
    return true
end

-- v, or a shared empty table to walk when v is no table (callers only read it).
local NONE = {}

local function list_of(v)
    return type(v) == "table" and v or NONE
end

--- True when the list (nil: none) holds v: a configuration list of names, a pod's groups.
function M.contains(list, v)
    for _, x in ipairs(list or NONE) do
        if x == v then
            return true
        end
    end
    return false
end

-- 'container "name"' for messages.
local function cname(c)
    local n = get(c, "name")
    return type(n) == "string" and string.format("container %q", n) or "unnamed container"
end

-- parent[key] as a JSON "object" or "array" (shape), created when missing or null; an error
-- naming where .. key when it is something else, after 'container "name": ' when c is given
-- (named only then: cname formats a string).
local function child(lvl, fname, parent, key, shape, where, c)
    local v = parent[key]
    if getmetatable(v) == shape then
        return v -- a JSON table of that shape, the common case: one C call instead of two
    elseif v == nil or v == null then
        v = shape == "array" and gg.array() or gg.object()
        parent[key] = v
    elseif type(v) ~= "table" or (shape == "object" and gg.is_array(v))
        or (shape == "array" and gg.is_object(v)) then
        fail(lvl + 1, fname, "%s%s%s is %s, want an %s", c and cname(c) .. ": " or "", where,
             key, what(v), shape)
    end
    return v
end

-- Remove parent[field][key] (parent a table); drop parent[field] when that leaves it empty.
-- Returns the value.
local function remove_from(parent, field, key)
    local map = parent[field]
    if type(map) ~= "table" or map[key] == nil then
        return nil
    end
    local old = map[key]
    map[key] = nil
    if is_empty(map) then
        parent[field] = nil
    end
    if old == null then
        return nil
    end
    return old
end

-- Argument errors.  Callers test the argument themselves and call these only when it is wrong:
-- writers run on every GPU pod, and a Lua call per check is most of a check's cost.
local function not_table(lvl, fname, name, v)
    fail(lvl + 1, fname, "%s must be a table, got %s", name, what(v))
end

local function not_string(lvl, fname, name, v)
    fail(lvl + 1, fname, "%s must be a non-empty string, got %s", name, what(v))
end

-- The arguments of a writer of one string entry (a label, a node selector, an environment
-- variable): the table t it writes into (named tname), key (named kname) a non-empty string,
-- value a string.
local function entry_args(lvl, fname, tname, t, kname, key, entry, value)
    if type(t) ~= "table" then
        not_table(lvl + 1, fname, tname, t)
    end
    if type(key) ~= "string" or key == "" then
        not_string(lvl + 1, fname, kname, key)
    end
    if type(value) ~= "string" then
        fail(lvl + 1, fname, "%svalue of %s %q must be a string, got %s",
             tname == "container" and cname(t) .. ": " or "", entry, key, what(value))
    end
end

-- Pods and pod templates ----------------------------------------------------------------------

-- Where the one pod template of a built-in kind is: the keys from the object to the table that
-- holds metadata and spec ({} for a Pod, which is its own template).  Keyed "group/Kind".
local SINGLE = {
    ["/Pod"] = {},
    ["/PodTemplate"] = { "template" },
    ["/ReplicationController"] = { "spec", "template" },
    ["batch/Job"] = { "spec", "template" },
    ["batch/CronJob"] = { "spec", "jobTemplate", "spec", "template" },
}
for _, kind in ipairs({ "Deployment", "ReplicaSet", "StatefulSet", "DaemonSet" }) do
    SINGLE["apps/" .. kind] = { "spec", "template" }
    if kind ~= "StatefulSet" then
        SINGLE["extensions/" .. kind] = { "spec", "template" } -- manifests older than 1.16
    end
end

-- The API group assumed for a kind when the object has no apiVersion (bare manifests).
local DEFAULT_GROUP = {
    Pod = "", PodTemplate = "", ReplicationController = "",
    Deployment = "apps", ReplicaSet = "apps", StatefulSet = "apps", DaemonSet = "apps",
    Job = "batch", CronJob = "batch",
    PyTorchJob = "kubeflow.org", TFJob = "kubeflow.org", MPIJob = "kubeflow.org",
    XGBoostJob = "kubeflow.org", PaddleJob = "kubeflow.org", JAXJob = "kubeflow.org",
    RayCluster = "ray.io", RayJob = "ray.io", RayService = "ray.io",
    JobSet = "jobset.x-k8s.io", LeaderWorkerSet = "leaderworkerset.x-k8s.io",
}

-- "group/Kind" of obj ("/Pod" for the core group), or nil.
local function type_key(obj)
    local kind = get(obj, "kind")
    if type(kind) ~= "string" then
        return nil
    end
    local av, group = get(obj, "apiVersion"), nil
    if type(av) == "string" then
        group = av:match("^(.*)/") or ""
    else
        group = DEFAULT_GROUP[kind]
    end
    return group and group .. "/" .. kind
end

-- The template of a built-in pod-bearing object and its field path ("" for a Pod), or nil.
local function single_template(obj)
    if type(obj) == "table" and obj.kind == "Pod" and obj.apiVersion == "v1" then
        return obj, "" -- the common case, without building the type key
    end
    local keys = SINGLE[type_key(obj)]
    if not keys then
        return nil
    end
    local tpl = obj
    for _, key in ipairs(keys) do
        tpl = get(tpl, key)
    end
    if type(tpl) ~= "table" then
        return nil
    end
    return tpl, table.concat(keys, ".")
end

--- The PodSpec of a Pod, Deployment, ReplicaSet, StatefulSet, DaemonSet, ReplicationController,
--- Job, CronJob or PodTemplate; nil for other kinds or when it is missing.
function M.pod_spec(obj)
    local tpl = obj -- a v1 Pod tested here as in single_template: policies ask for it often
    if type(obj) ~= "table" or obj.kind ~= "Pod" or obj.apiVersion ~= "v1" then
        tpl = single_template(obj) -- nil or a table
    end
    local spec = tpl and tpl.spec
    return type(spec) == "table" and spec or nil
end

--- The metadata of the pod: the object's own for a Pod, the template's for a controller; nil
--- when missing or for other kinds.  Creates nothing.
function M.pod_meta(obj)
    local tpl = single_template(obj) -- nil or a table
    local meta = tpl and tpl.metadata
    return type(meta) == "table" and meta or nil
end

-- Custom resources with pod templates: finder(spec, add) calls add(template, field_path) for
-- each template, in document order.

local function index_path(prefix, i, suffix)
    return string.format("%s[%d]%s", prefix, i - 1, suffix)
end

-- Kubeflow training operator: spec.<x>ReplicaSpecs.<Role>.template, roles in name order.
local function kubeflow(spec, add)
    local fields = {}
    for field, roles in pairs(list_of(spec)) do
        if type(field) == "string" and field:find("ReplicaSpecs$") and type(roles) == "table" then
            fields[#fields + 1] = field
        end
    end
    table.sort(fields)
    for _, field in ipairs(fields) do
        local roles = {}
        for role in pairs(spec[field]) do
            roles[#roles + 1] = role
        end
        table.sort(roles)
        for _, role in ipairs(roles) do
            add(get(spec, field, role, "template"), "spec." .. field .. "." .. role .. ".template")
        end
    end
end

-- A RayCluster spec rc at field path path (also found inside RayJob and RayService).
local function ray_cluster(rc, path, add)
    add(get(rc, "headGroupSpec", "template"), path .. ".headGroupSpec.template")
    for i, group in ipairs(list_of(get(rc, "workerGroupSpecs"))) do
        add(get(group, "template"), index_path(path .. ".workerGroupSpecs", i, ".template"))
    end
end

local MULTI = {
    ["ray.io/RayCluster"] = function(spec, add)
        ray_cluster(spec, "spec", add)
    end,
    ["ray.io/RayJob"] = function(spec, add)
        ray_cluster(get(spec, "rayClusterSpec"), "spec.rayClusterSpec", add)
        add(get(spec, "submitterPodTemplate"), "spec.submitterPodTemplate")
    end,
    ["ray.io/RayService"] = function(spec, add)
        ray_cluster(get(spec, "rayClusterConfig"), "spec.rayClusterConfig", add)
    end,
    ["jobset.x-k8s.io/JobSet"] = function(spec, add)
        for i, rj in ipairs(list_of(get(spec, "replicatedJobs"))) do
            add(get(rj, "template", "spec", "template"),
                index_path("spec.replicatedJobs", i, ".template.spec.template"))
        end
    end,
    ["leaderworkerset.x-k8s.io/LeaderWorkerSet"] = function(spec, add)
        local lwt = get(spec, "leaderWorkerTemplate")
        add(get(lwt, "leaderTemplate"), "spec.leaderWorkerTemplate.leaderTemplate")
        add(get(lwt, "workerTemplate"), "spec.leaderWorkerTemplate.workerTemplate")
    end,
    ["batch.volcano.sh/Job"] = function(spec, add)
        for i, task in ipairs(list_of(get(spec, "tasks"))) do
            add(get(task, "template"), index_path("spec.tasks", i, ".template"))
        end
    end,
}

--- Every pod template in obj, in document order, as a list of
---   { template = <the table holding metadata and spec>, spec = <PodSpec>,
---     meta = <template metadata or nil>, path = <field path of spec> }.
--- Covers the kinds of pod_spec (one entry; for a Pod, template is the Pod and path "spec"),
--- Kubeflow jobs, RayCluster/RayJob/RayService, JobSet, LeaderWorkerSet and Volcano Job.
--- Empty for other kinds.  Paths use 0-based indexes: "spec.workerGroupSpecs[1].template.spec".
function M.pod_templates(obj)
    local out = {}
    local function add(tpl, path)
        local spec, meta = get(tpl, "spec"), get(tpl, "metadata")
        if type(spec) == "table" then
            out[#out + 1] = {
                template = tpl,
                spec = spec,
                meta = type(meta) == "table" and meta or nil,
                path = path == "" and "spec" or path .. ".spec",
            }
        end
    end
    local tpl, path = single_template(obj)
    if tpl then
        add(tpl, path)
        return out
    end
    local key = type_key(obj)
    local finder = MULTI[key]
    if not finder and key and key:find("^kubeflow%.org/") then
        finder = kubeflow
    end
    if finder then
        finder(get(obj, "spec"), add)
    end
    return out
end

--- The kind of the object's controller (the ownerReference with controller: true), e.g.
--- "ReplicaSet", "Job", "DaemonSet", and that ownerReference; nil when there is none.
function M.owner_kind(obj)
    local refs = list_of(get(obj, "metadata", "ownerReferences"))
    for i = 1, #refs do -- by index: in validate, ipairs would add a C call per entry
        local ref = refs[i]
        if ref == nil then
            break
        elseif get(ref, "controller") == true then
            return get(ref, "kind"), ref
        end
    end
    return nil
end

-- Containers ---------------------------------------------------------------------------------

-- The container lists of a PodSpec in walking order: field and kind.
local FIELDS = { "initContainers", "containers", "ephemeralContainers" }
local KINDS = { "init", "regular", "ephemeral" }
local FIELD_OF = { init = "initContainers", regular = "containers",
                   ephemeral = "ephemeralContainers" }

-- The kinds to walk as WANTS[mask][list number], mask bits from BIT: one shared table per set
-- of kinds, so choosing kinds allocates nothing.
local BIT = { init = 1, regular = 2, ephemeral = 4 }
local WANTS = {}
for mask = 0, 7 do
    WANTS[mask] = { mask & 1 ~= 0, mask & 2 ~= 0, mask & 4 ~= 0 }
end
local ALL_KINDS = WANTS[7]
local INIT_AND_REGULAR = WANTS[BIT.init | BIT.regular]

-- The set of kinds opts asks for.
local function wanted_kinds(lvl, fname, opts)
    if opts == nil then
        return ALL_KINDS
    end
    if not is_map(opts) then
        fail(lvl + 1, fname, "opts must be a table such as {regular = true}, got %s", what(opts))
    end
    local mask = 0
    for k, v in pairs(opts) do
        local bit = BIT[k]
        if not bit then
            fail(lvl + 1, fname, "unknown option %q (want init, regular or ephemeral)",
                 tostring(k))
        end
        if v then
            mask = mask | bit
        end
    end
    return WANTS[mask]
end

local function no_containers()
    return nil
end

-- A list is read from spec when the walk reaches it and its entries one by one: a caller may
-- edit containers and the lists in place while it walks, but a list it puts into spec in place
-- of one being walked is not seen.  (No caller in lua/ or policies/ edits what it walks.)
local function iterate(spec, want)
    if type(spec) ~= "table" then
        return no_containers
    end
    local li, i, list = 0, 0, NONE
    return function()
        while true do
            i = i + 1
            local c = list[i]
            if c == nil then -- on to the next list wanted and present
                repeat
                    li = li + 1
                    if li > 3 then
                        list = NONE -- and so on every later call
                        return nil
                    end
                    list = want[li] and spec[FIELDS[li]]
                until list and type(list) == "table" -- no type() call for a missing list
                i = 0
            elseif type(c) == "table" then
                return c, KINDS[li], i
            end -- else a null: skipped
        end
    end
end

--- Iterate over the containers of a PodSpec: init containers, then regular, then ephemeral.
--- Yields container, kind ("init" | "regular" | "ephemeral") and its 1-based index in its list.
--- opts picks kinds, e.g. {init = true, regular = true}; nil means all three.
function M.containers(spec, opts)
    return iterate(spec, wanted_kinds(2, "containers", opts))
end

--- The containers of a PodSpec as a list (opts as for containers()).
function M.all_containers(spec, opts)
    local out = {}
    for c in iterate(spec, wanted_kinds(2, "all_containers", opts)) do
        out[#out + 1] = c
    end
    return out
end

--- The container named name (any kind), its kind and index; nil when there is none.
function M.container(spec, name)
    for c, kind, i in iterate(spec, ALL_KINDS) do
        if get(c, "name") == name then
            return c, kind, i
        end
    end
    return nil
end

--- The field path of a container for messages, from the path of its PodSpec (pod_templates'
--- path), its kind and its 1-based index as containers() yields them:
--- container_path("spec.template.spec", "init", 1) -> "spec.template.spec.initContainers[0]".
function M.container_path(spec_path, kind, index)
    local field = FIELD_OF[kind]
    if field then
        return index_path(spec_path .. "." .. field, index, "")
    end
    fail(2, "container_path", "kind must be \"init\", \"regular\" or \"ephemeral\", got %s",
         show(kind))
end

--- True for a sidecar: an init container with restartPolicy "Always" (Kubernetes 1.28+).
--- kind, when given, must be "init" for a sidecar.
function M.is_sidecar(container, kind)
    return (kind == nil or kind == "init") and get(container, "restartPolicy") == "Always"
end

-- Resources ----------------------------------------------------------------------------------

local SECTIONS = { requests = true, limits = true }

-- Callers test SECTIONS[section] themselves: a call only when it fails keeps reads cheap.
local function bad_section(lvl, fname, section)
    fail(lvl + 1, fname, "section must be \"requests\" or \"limits\", got %s",
         show(section))
end

-- The quantity string at resources.<section>[name]; numbers (from YAML manifests) as strings.
-- The walk is get()'s, written out: policies read resources more than anything else.
local function resource_string(lvl, fname, c, section, name)
    local map = type(c) == "table" and c.resources or nil
    map = type(map) == "table" and map[section] or nil
    local v = nil
    if type(map) == "table" then
        v = map[name]
    end
    if v == nil or v == null then
        return nil
    elseif type(v) == "string" then
        return v
    elseif math.type(v) then
        return tostring(v)
    end
    fail(lvl + 1, fname, "%s: resources.%s[%q] is %s, want a quantity string", cname(c),
         section, tostring(name), what(v))
end

local function resource_milli(lvl, fname, c, section, name)
    local s = resource_string(lvl + 1, fname, c, section, name)
    if s == nil then
        return nil
    end
    local milli, err = gg.quantity(s)
    if not milli then
        fail(lvl + 1, fname, "%s: resources.%s[%q] = %q is not a quantity: %s", cname(c),
             section, tostring(name), s, tostring(err))
    end
    return milli
end

local function request_milli(lvl, fname, c, name)
    local r = resource_milli(lvl + 1, fname, c, "requests", name)
    if r == nil then
        r = resource_milli(lvl + 1, fname, c, "limits", name)
    end
    return r
end

--- The quantity string of resources.<section>[name] (section "requests" or "limits"), or nil.
function M.get_resource(container, section, name)
    if not SECTIONS[section] then
        bad_section(2, "get_resource", section)
    end
    return (resource_string(2, "get_resource", container, section, name))
end

--- resources.<section>[name] in integer milli-units ("2" -> 2000, "500m" -> 500), or nil.
function M.resource_milli(container, section, name)
    if not SECTIONS[section] then
        bad_section(2, "resource_milli", section)
    end
    return (resource_milli(2, "resource_milli", container, section, name))
end

--- The effective request of a container in milli-units: requests[name], or limits[name] when
--- no request is given (the API server defaults it so); nil when neither is set.
function M.request_milli(container, name)
    return (request_milli(2, "request_milli", container, name))
end

--- The pod's effective request of a resource in milli-units, as the scheduler computes it:
--- max(sum over regular and sidecar containers, each init container plus the sidecars started
--- before it) plus spec.overhead[name].  Ephemeral containers do not count.  0 when unused.
function M.pod_request_milli(spec, name)
    local sum, init_max, sidecars = 0, 0, 0
    for c, kind in iterate(spec, INIT_AND_REGULAR) do
        local r = request_milli(2, "pod_request_milli", c, name) or 0
        if kind == "regular" then
            sum = sum + r
        elseif M.is_sidecar(c) then
            sum, sidecars = sum + r, sidecars + r
            init_max = math.max(init_max, sidecars)
        else
            init_max = math.max(init_max, r + sidecars)
        end
    end
    local total = math.max(sum, init_max)
    local overhead = get(spec, "overhead", name)
    if overhead ~= nil then
        local milli, err = gg.quantity(tostring(overhead))
        if not milli then
            fail(2, "pod_request_milli", "spec.overhead[%q] = %q is not a quantity: %s",
                 tostring(name), tostring(overhead), tostring(err))
        end
        total = total + milli
    end
    return total
end

--- Set resources.<section>[name] = value (a quantity string, or an integer written as a
--- string), creating resources and the section as objects when missing.  An equal quantity
--- already there ("1000m" for "1") is left as it is.  Returns true when the container changed.
function M.set_resource(container, section, name, value)
    local f = "set_resource"
    if type(container) ~= "table" then
        not_table(2, f, "container", container)
    end
    if not SECTIONS[section] then
        bad_section(2, f, section)
    end
    if type(name) ~= "string" or name == "" then
        not_string(2, f, "resource name", name)
    end
    if type(value) ~= "string" then -- tested first: a string, the common case, is one C call
        if math.type(value) ~= "integer" then
            fail(2, f, "%s: %s[%q] must be a quantity string such as \"1\" or \"500m\", got %s",
                 cname(container), section, name, what(value))
        end
        value = tostring(value)
    end
    local milli, err = gg.quantity(value)
    if not milli then
        fail(2, f, "%s: %s[%q]: %q is not a quantity: %s", cname(container), section, name,
             value, tostring(err))
    end
    local res = child(2, f, container, "resources", "object", "", container)
    local map = child(2, f, res, section, "object", "resources.", container)
    local old = map[name]
    if old == value or (old ~= nil and old ~= null and gg.quantity(tostring(old)) == milli) then
        return false
    end
    map[name] = value
    return true
end

--- Remove resources.<section>[name]; a section left empty is removed, then resources when it
--- is left empty.  Returns the removed value or nil.
function M.remove_resource(container, section, name)
    if not SECTIONS[section] then
        bad_section(2, "remove_resource", section)
    end
    -- get(container, "resources") written out: drop_gpu runs this on every MIG pod
    local res = type(container) == "table" and container.resources or nil
    if type(res) ~= "table" then
        return nil
    end
    local old = remove_from(res, section, name)
    if old ~= nil and is_empty(res) then
        container.resources = nil
    end
    return old
end

-- Labels and annotations ---------------------------------------------------------------------

-- The metadata of t: t.metadata when t is an object (it has metadata, spec, kind or
-- apiVersion), else t itself.  With create, a missing metadata is created.
local function meta_of(lvl, fname, t, create)
    local meta = t.metadata
    if meta == nil and t.spec == nil and t.kind == nil and t.apiVersion == nil then
        return t
    elseif create then
        return (child(lvl + 1, fname, t, "metadata", "object", ""))
    end
    return type(meta) == "table" and meta or nil
end

-- get(meta_of(t), field, key), written out: policies read labels and annotations often.
local function meta_get(t, field, key)
    if type(t) ~= "table" then
        return nil
    end
    local meta = t.metadata
    if meta == nil then
        if t.spec ~= nil or t.kind ~= nil or t.apiVersion ~= nil then
            return nil
        end
        meta = t
    elseif type(meta) ~= "table" then
        return nil
    end
    local v = meta[field]
    if key ~= nil then
        if type(v) ~= "table" then
            return nil
        end
        v = v[key]
    end
    if v == null then
        return nil
    end
    return v
end

-- An entry of each map meta_set writes, for messages (no string made per call).
local ENTRY = { labels = "label", annotations = "annotation" }

local function meta_set(lvl, fname, t, field, key, value)
    entry_args(lvl + 1, fname, "object or metadata", t, "key", key, ENTRY[field], value)
    local meta = meta_of(lvl + 1, fname, t, true)
    local map = child(lvl + 1, fname, meta, field, "object", "metadata.")
    if map[key] == value then
        return false
    end
    map[key] = value
    return true
end

local function meta_remove(t, field, key)
    if type(t) ~= "table" then
        return nil
    end
    local meta = meta_of(2, "", t, false)
    if meta == nil then
        return nil
    end
    return remove_from(meta, field, key)
end

-- A label value: empty, or at most 63 letters, digits, '-', '_' and '.', beginning and ending
-- with a letter or digit.
local function valid_label_value(v)
    return v == "" or (#v <= 63 and v:find("^%w[%w_.%-]*$") ~= nil and v:find("%w$") ~= nil)
end

--- The label key of an object (from its metadata) or of a metadata table; nil when absent.
function M.label(obj_or_meta, key)
    local labels = meta_get(obj_or_meta, "labels")
    if key == nil then
        return labels
    elseif type(labels) ~= "table" then
        return nil
    end
    -- peek: a policy reads a label or two, and labels it leaves unfilled are a table fewer for
    -- the diff to walk (and one fill fewer in validate)
    local v = gg.peek(labels, key)
    if v == null then
        return nil
    end
    return v
end

--- Set a label on an object or a metadata table, creating metadata and labels as objects when
--- missing.  value must be a valid label value.  Returns true when it changed.
function M.set_label(obj_or_meta, key, value)
    if type(value) == "string" and not valid_label_value(value) then
        fail(2, "set_label", "label %q: %q is not a valid label value (at most 63 letters, "
             .. "digits, '-', '_' or '.', beginning and ending with a letter or digit)",
             tostring(key), value)
    end
    return (meta_set(2, "set_label", obj_or_meta, "labels", key, value))
end

--- Remove a label; a labels map left empty is removed.  Returns the removed value or nil.
function M.remove_label(obj_or_meta, key)
    return meta_remove(obj_or_meta, "labels", key)
end

--- All the annotations of an object or of a metadata table, as the map annotation() reads
--- (the object's own, not copied: read several keys from it with one walk); nil when none.
function M.annotations(obj_or_meta)
    local a = meta_get(obj_or_meta, "annotations")
    return type(a) == "table" and a or nil
end

--- The annotation key of an object or of a metadata table; nil when absent.
function M.annotation(obj_or_meta, key)
    return meta_get(obj_or_meta, "annotations", key)
end

--- Set an annotation (a string), creating metadata and annotations as objects when missing.
--- Returns true when it changed.
function M.set_annotation(obj_or_meta, key, value)
    return (meta_set(2, "set_annotation", obj_or_meta, "annotations", key, value))
end

--- Remove an annotation; an annotations map left empty is removed.  Returns the removed value
--- or nil.
function M.remove_annotation(obj_or_meta, key)
    return meta_remove(obj_or_meta, "annotations", key)
end

-- Tolerations --------------------------------------------------------------------------------

local EFFECTS = { [""] = true, NoSchedule = true, PreferNoSchedule = true, NoExecute = true }
local TOLERATION_FIELDS = { "key", "operator", "value", "effect" }

local function str(v)
    return (v == nil or v == null) and "" or v
end

-- A toleration with the defaults filled in: operator Equal, "" for missing strings.
local function norm(t)
    local secs = t.tolerationSeconds
    return {
        key = str(t.key),
        operator = str(t.operator) == "" and "Equal" or t.operator,
        value = str(t.value),
        effect = str(t.effect),
        seconds = secs ~= null and secs or nil,
    }
end

-- True when toleration have, as written in a spec, tolerates every taint that want (normalised)
-- tolerates.  have is read field by field as norm would fill it in, without a table for it.
local function covers(have, want)
    local effect, key = have.effect, have.key -- str(...) ~= "" written out for these two
    if effect ~= nil and effect ~= null and effect ~= "" and effect ~= want.effect then
        return false
    elseif key ~= nil and key ~= null and key ~= "" and key ~= want.key then
        return false
    elseif have.operator ~= "Exists"
        and (want.operator ~= "Equal" or str(have.value) ~= want.value) then
        return false
    end
    local secs = have.tolerationSeconds
    secs = secs ~= null and secs or nil
    if secs ~= nil and (want.seconds == nil or want.seconds > secs) then
        return false
    end
    return true
end

local function check_toleration(lvl, fname, tol)
    if not is_map(tol) then
        fail(lvl + 1, fname, "toleration must be a table, got %s", what(tol))
    end
    local t = norm(tol)
    if t.operator ~= "Equal" and t.operator ~= "Exists" then
        fail(lvl + 1, fname, "toleration %q: operator must be \"Equal\" or \"Exists\", got %q",
             tostring(t.key), tostring(t.operator))
    elseif t.operator == "Exists" and t.value ~= "" then
        fail(lvl + 1, fname, "toleration %q: operator Exists takes no value, got %q",
             tostring(t.key), tostring(t.value))
    elseif t.key == "" and t.operator ~= "Exists" then
        fail(lvl + 1, fname, "a toleration without a key must have operator \"Exists\"")
    elseif not EFFECTS[t.effect] then
        fail(lvl + 1, fname, "toleration %q: effect must be NoSchedule, PreferNoSchedule, "
             .. "NoExecute or empty, got %q", tostring(t.key), tostring(t.effect))
    elseif t.seconds ~= nil and math.type(t.seconds) ~= "integer" then
        fail(lvl + 1, fname, "toleration %q: tolerationSeconds must be an integer, got %s",
             tostring(t.key), what(t.seconds))
    end
    return t
end

local function tolerated(spec, want)
    local list = list_of(get(spec, "tolerations"))
    for i = 1, #list do -- by index: ipairs would add a C call per toleration
        local have = list[i]
        if have == nil then
            break
        elseif type(have) == "table" and covers(have, want) then
            return true
        end
    end
    return false
end

--- True when spec.tolerations already tolerates every taint tol tolerates: an existing
--- toleration with the same key (or an Exists one without key), the same operator (Equal by
--- default) and value (or Exists, which matches any value), and the same effect (or none,
--- which matches every effect).
function M.has_toleration(spec, tol)
    return tolerated(spec, check_toleration(2, "has_toleration", tol))
end

--- Append a copy of tol to spec.tolerations (created as an array when missing) unless
--- has_toleration(spec, tol).  Returns true when it was added.
function M.add_toleration(spec, tol)
    local t = check_toleration(2, "add_toleration", tol)
    if type(spec) ~= "table" then
        not_table(2, "add_toleration", "spec", spec)
    end
    if tolerated(spec, t) then
        return false
    end
    local copy = gg.object()
    for i = 1, #TOLERATION_FIELDS do
        local field = TOLERATION_FIELDS[i]
        if t[field] ~= "" then
            copy[field] = tol[field]
        end
    end
    copy.tolerationSeconds = t.seconds
    local list = child(2, "add_toleration", spec, "tolerations", "array", "spec.")
    list[#list + 1] = copy
    return true
end

-- Node selectors -----------------------------------------------------------------------------

--- spec.nodeSelector[key], or nil.
function M.node_selector(spec, key)
    return get(spec, "nodeSelector", key)
end

--- Set spec.nodeSelector[key] = value (a string), creating nodeSelector as an object when
--- missing.  Returns true when it changed.
function M.set_node_selector(spec, key, value)
    local f = "set_node_selector"
    entry_args(2, f, "spec", spec, "key", key, "node selector", value)
    local sel = child(2, f, spec, "nodeSelector", "object", "spec.")
    if sel[key] == value then
        return false
    end
    sel[key] = value
    return true
end

--- Remove spec.nodeSelector[key]; a nodeSelector left empty is removed.  Returns the removed
--- value or nil.
function M.remove_node_selector(spec, key)
    if type(spec) ~= "table" then
        return nil
    end
    return remove_from(spec, "nodeSelector", key)
end

-- Environment --------------------------------------------------------------------------------

--- The value of environment variable name in a container, and its env entry.  The last entry
--- of that name wins, as in Kubernetes.  An entry without value gives ""; an entry with
--- valueFrom gives nil and the entry.  nil when there is no such variable.
function M.get_env(container, name)
    local entry
    for _, e in ipairs(list_of(get(container, "env"))) do
        if get(e, "name") == name then
            entry = e
        end
    end
    if entry == nil then
        return nil
    elseif get(entry, "valueFrom") ~= nil then
        return nil, entry
    end
    return get(entry, "value") or "", entry
end

--- Set environment variable name to value (a string): every entry of that name gets the value
--- (and loses any valueFrom); when there is none, {name = name, value = value} is appended to
--- env (created as an array when missing).  Returns true when the container changed.
function M.set_env(container, name, value)
    local f = "set_env"
    entry_args(2, f, "container", container, "name", name, "environment variable", value)
    local env = child(2, f, container, "env", "array", "", container)
    local found, changed = false, false
    for _, e in ipairs(env) do
        if get(e, "name") == name then
            found = true
            if e.value ~= value or e.valueFrom ~= nil then
                e.value, e.valueFrom = value, nil
                changed = true
            end
        end
    end
    if not found then
        env[#env + 1] = gg.object({ name = name, value = value })
        changed = true
    end
    return changed
end

--- The table memo keeps for pod's request: memo[gpuguard.frozen(pod)], made empty the first
--- time.  The view is one key for the whole request, in both phases (the pod mutate edits and the
--- pod validate reads); memo is to be weak-keyed, so that what is kept goes with the request.
function M.request_memo(memo, pod)
    local key = gg.frozen(pod)
    local m = memo[key]
    if m == nil then
        m = {}
        memo[key] = m
    end
    return m
end

return M
