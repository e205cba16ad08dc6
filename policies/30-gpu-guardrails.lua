--[[
30-gpu-guardrails.lua - the rules that keep GPU access through the device plugin and GPU
accounting honest.

validate, at pod CREATE:
  * no container of any pod sets NVIDIA_VISIBLE_DEVICES, NVIDIA_DRIVER_CAPABILITIES or
    NVIDIA_MIG_CONFIG_DEVICES (with the device plugin's default envvar strategy, "all" shows the
    container every GPU of its node), except the values "void" and "none" and the ConfigMap
    references of guardrails.gpu_env_config_maps (KAI's for its fraction pods); no envFrom with
    a prefix that could spell one of them (NVIDIA_...);
  * on a HAMi or Volcano vGPU: no container sets the variables HAMi-core reads for the share's
    limits (CUDA_DISABLE_CONTROL, CUDA_DEVICE_MEMORY_LIMIT[_<n>], CUDA_DEVICE_SM_LIMIT), nor
    takes envFrom with a prefix that could spell one (cooperative: a command that exports them
    defeats it; the node enforces nothing of the kind);
  * no hostPath volume that is, holds or lies under a GPU device or driver path
    (guardrails.host_paths), the path normalised first (/dev/./nvidia0 is /dev/nvidia0);
  * no spec.nodeName (it skips the scheduler and every taint) unless the requester is in
    guardrails.bind_allowed (default: group system:nodes, the kubelet's mirror pods); not judged
    in the audit of a running pod (req.background), whose nodeName the scheduler set;
  * no privileged container in a pod without a GPU (privileged sees every device of the node);
  * on a shared GPU (fractional, MIG, MPS, time-sliced, HAMi, Volcano vGPU, KAI, a DRA MIG device
    or shared claim: intent.shared): no privileged container, no added capability SYS_ADMIN or
    SYS_PTRACE (or ALL), no hostPID or hostIPC: each reaches the other pods on the GPU;
  * GPU resources have requests equal to limits (a request alone, or different values, is
    refused by Kubernetes later with a less helpful message);
  * GPU pods carry the labels of guardrails.required_labels (cost attribution);
  * pods of a class with max_runtime set activeDeadlineSeconds at most that long: bare pods and
    the pods of Jobs and operators.  Not the pods (nor templates) of a ReplicaSet, StatefulSet,
    DaemonSet or ReplicationController (so not a Deployment's, a Notebook's, a
    LeaderWorkerSet's): their controller replaces a pod that ends, so a deadline would restart
    it in a loop, and the API server refuses the field in their templates.  Such a pod is
    taken for one only when that controller creates it (an ownerReference proves nothing).
validate, at pod UPDATE (guardrails.update_allowed may do all of it, e.g. Kueue's controller):
  * the update may not change a gpuguard.io/ label or annotation;
  * on a scheduling-gated pod it may not add a toleration of a GPU pool's taint, a nodeSelector
    entry of a pool or a required node affinity term that selects a pool;
  * on any other pod that asks for no GPU it may not add a toleration of a GPU pool's taint
    (the plumbing exempt, as at CREATE);
  * pods/ephemeralcontainers: each new ephemeral container gets the container rules above.
mutate, at CREATE:
  * pods of a class with max_runtime and no activeDeadlineSeconds get it set to max_runtime;
    those of a controller that replaces them (above) get a warning instead.

Pods of the GPU plumbing (workload.exempt: placement.exempt_namespaces and
placement.exempt_service_accounts) are exempt from the environment, hostPath,
privileged-without-GPU and required-label rules.

Config keys: guardrails.required_labels, guardrails.host_paths, guardrails.gpu_env_config_maps,
guardrails.bind_allowed, guardrails.update_allowed, classes.<class>.max_runtime,
placement.exempt_namespaces, placement.exempt_service_accounts.
]]

local gg = require "gpuguard"
local k8s = require "k8s"
local intent = require "intent"
local fleet = require "fleet"
local workload = require "workload"

local SECTIONS = { "requests", "limits" }
local NONE = {}

-- The variables that choose the GPUs and driver features a container gets; only the device
-- plugin and the GPU plumbing set them.
local GPU_ENV = { NVIDIA_VISIBLE_DEVICES = true, NVIDIA_DRIVER_CAPABILITIES = true,
    NVIDIA_MIG_CONFIG_DEVICES = true }
local GPU_ENV_PREFIX = "NVIDIA_"
-- Values that say "no GPU".
local NO_GPU_VALUES = { void = true, none = true }
-- The variables HAMi-core (the vGPU limits of HAMi and Volcano) reads in the container: set by
-- the device plugin, and a pod's own switch its limits off (CUDA_DISABLE_CONTROL) or override
-- them.  CUDA_DEVICE_MEMORY_LIMIT_<n> is the limit of the n-th device.
local VGPU_ENV = { "CUDA_DISABLE_CONTROL", "CUDA_DEVICE_MEMORY_LIMIT", "CUDA_DEVICE_SM_LIMIT" }
local VGPU_SHARING = { hami = true, volcano = true }

-- GPU device and driver paths on the host when guardrails.host_paths is not set; a "*" ends the
-- last part of a path.  /, /dev, /run, /var/run, /usr/lib... hold one of these and are denied
-- for that.
local DEFAULT_HOST_PATHS = {
    "/dev/nvidia*", "/dev/dri", "/run/nvidia*", "/var/run/nvidia*", "/proc/driver/nvidia",
    "/usr/lib/x86_64-linux-gnu/libnvidia*", "/usr/lib/x86_64-linux-gnu/libcuda*",
    "/usr/lib/aarch64-linux-gnu/libnvidia*", "/usr/lib/aarch64-linux-gnu/libcuda*",
}
-- Who may set spec.nodeName when guardrails.bind_allowed is not set: the kubelet (mirror pods).
local DEFAULT_BIND_ALLOWED = { groups = { "system:nodes" } }
-- Capabilities that reach other processes on the node: on a shared GPU, the other pods' work.
local SHARED_GPU_CAPS = { SYS_ADMIN = true, SYS_PTRACE = true, ALL = true }
local PREFIX = "gpuguard.io/"
local EPHEMERAL = { ephemeral = true }

-- Per-request state of the CREATE rules: whether the pod asks for a GPU and, asked once when a
-- rule needs it, whether it is on a shared GPU.
local function new_ctx(req, pod, spec, cfg)
    return { req = req, pod = pod, spec = spec, cfg = cfg,
        gpu = workload.wants_gpu(pod, cfg, req.namespace) }
end

-- Is the pod on a vGPU of HAMi or Volcano, whose limits HAMi-core enforces in the container?
-- Its pool (gpuguard.io/pool, gpu-sharing's, written over whatever the pod brought), else the
-- dialect it is written in.
local function vgpu(ctx)
    if ctx.vgpu == nil then
        local pool = fleet.pool(ctx.cfg, k8s.annotation(ctx.pod, intent.POOL))
        local d = not pool and intent.dialects(ctx.pod) or NONE
        ctx.vgpu = (pool and VGPU_SHARING[pool.sharing]) or d.hami or d.volcano or false
    end
    return ctx.vgpu
end

-- Is name one of HAMi-core's variables?
local function is_vgpu_env(name)
    return k8s.contains(VGPU_ENV, name) or name:match("^CUDA_DEVICE_MEMORY_LIMIT_%d+$") ~= nil
end

-- Could an envFrom prefix p complete to one of them with a ConfigMap's key?
local function spells_vgpu_env(p)
    for _, name in ipairs(VGPU_ENV) do
        if name:sub(1, #p) == p or p:sub(1, #name) == name then
            return true
        end
    end
    return false
end

local function shared(ctx)
    if ctx.shared == nil then
        ctx.shared = intent.shared(ctx.pod, ctx.cfg, ctx.req.namespace)
    end
    return ctx.shared
end

-- A denial the GPU plumbing is exempt from; workload.exempt is asked only when a rule found
-- something.
local function deny_unless_exempt(ctx, msg)
    if not workload.exempt(ctx.pod, ctx.req.namespace, ctx.cfg) then
        ctx.req:deny(msg .. workload.EXEMPT_HINT)
    end
end

-- Is the requester a user or in a group of allowed ({users = [...], groups = [...]})?
local function requester_in(req, allowed)
    local user = req.user or NONE
    if k8s.contains(allowed.users, user.username) then
        return true
    end
    for _, group in ipairs(user.groups or NONE) do
        if k8s.contains(allowed.groups, group) then
            return true
        end
    end
    return false
end

local function guardrails_of(cfg)
    return cfg.guardrails or NONE
end

-- Is env entry e of container c (kind and 1-based index as k8s.containers yields them) one of
-- the ConfigMap references of guardrails.gpu_env_config_maps: the variable name, exactly
-- valueFrom.configMapKeyRef with that key, the ConfigMap named after the pod's annotation and
-- the container ("<annotation>-<n>" for containers[n], "<annotation>-i<n>" for
-- initContainers[n], as KAI names them), and the scheduler?
local function configured_ref(ctx, c, kind, index, e)
    local from = e.valueFrom
    local ref = type(from) == "table" and from.configMapKeyRef
    if type(ref) ~= "table" or kind == "ephemeral" then
        return false
    end
    for k in pairs(from) do
        if k ~= "configMapKeyRef" then
            return false
        end
    end
    for _, r in ipairs(guardrails_of(ctx.cfg).gpu_env_config_maps or NONE) do
        local base = k8s.annotation(ctx.pod, r.name_annotation)
        if base and r.env == e.name and r.key == ref.key and
            (r.scheduler_name == nil or r.scheduler_name == ctx.spec.schedulerName) and
            ref.name == string.format(kind == "init" and "%s-i%d" or "%s-%d", base, index - 1) then
            return true
        end
    end
    return false
end

-- Each read of the pod in validate is a C call, and the first read of a table gives it a view
-- and fills it: what the rules ask of a container (its variables' names, envFrom, the
-- securityContext fields) is read with gg.peek and gg.fields from the container itself, which
-- stays untouched with all it holds, and an entry itself only for a GPU variable.
local function env_rules(ctx, c, kind, index)
    for i = 1, #gg.fields(c, "env") do
        local name = gg.peek(c, "env", i, "name")
        if type(name) == "string" and name:sub(1, 5) == "CUDA_" and is_vgpu_env(name) and vgpu(ctx) then
            ctx.req:deny(string.format("container %s sets %s, which HAMi-core reads to limit this pod's vGPU share (and CUDA_DISABLE_CONTROL switches the limits off); remove it: the device plugin sets the share's limits",
                c.name, name))
        end
        local e = GPU_ENV[name] and c.env[i]
        if e and not NO_GPU_VALUES[e.value] and not configured_ref(ctx, c, kind, index, e) then
            if ctx.gpu then
                deny_unless_exempt(ctx, string.format("container %s sets %s; remove it: the device plugin sets which GPUs and driver features a container gets",
                    c.name, name))
            else
                deny_unless_exempt(ctx, string.format("container %s sets %s but the pod asks for no GPU; remove it and ask for a GPU (nvidia.com/gpu or gpuguard.io/gpu-fraction)",
                    c.name, name))
            end
        end
    end
    -- A prefix that a ConfigMap's keys complete to NVIDIA_VISIBLE_DEVICES: "NVIDIA_..." or a
    -- start of "NVIDIA_" ("NV" and a key "IDIA_VISIBLE_DEVICES").
    local from = gg.peek(c, "envFrom")
    for _, f in ipairs(type(from) == "table" and from or NONE) do
        local p = type(f) == "table" and f.prefix
        if type(p) == "string" and p ~= "" and
            (p:sub(1, #GPU_ENV_PREFIX) == GPU_ENV_PREFIX or GPU_ENV_PREFIX:sub(1, #p) == p) then
            deny_unless_exempt(ctx, string.format("container %s takes envFrom with prefix %s, which can set NVIDIA_VISIBLE_DEVICES; use a prefix that does not start with NVIDIA_",
                c.name, p))
        end
        if type(p) == "string" and p ~= "" and spells_vgpu_env(p) and vgpu(ctx) then
            ctx.req:deny(string.format("container %s takes envFrom with prefix %s, which can set HAMi-core's limits of this pod's vGPU share (CUDA_DEVICE_*, CUDA_DISABLE_CONTROL); use a prefix that cannot spell them",
                c.name, p))
        end
    end
end

-- shared() is asked only of pods that set what it could forbid.
local function privilege_rules(ctx, c)
    if gg.peek(c, "securityContext", "privileged") == true then
        if shared(ctx) then
            ctx.req:deny(string.format("container %s is privileged on a shared GPU and would see every GPU of the node; drop privileged or use exclusive GPUs",
                c.name))
        elseif not ctx.gpu then
            deny_unless_exempt(ctx, string.format("container %s is privileged but the pod asks for no GPU, and privileged sees every GPU of the node; drop privileged",
                c.name))
        end
    end
    local caps = gg.peek(c, "securityContext", "capabilities", "add")
    for _, cap in ipairs(type(caps) == "table" and caps or NONE) do
        local name = type(cap) == "string" and cap:upper():gsub("^CAP_", "")
        if SHARED_GPU_CAPS[name] and shared(ctx) then
            ctx.req:deny(string.format("container %s adds capability %s on a shared GPU and could reach the other pods on that GPU; drop it or use exclusive GPUs",
                c.name, cap))
        end
    end
end

-- The rules on one container (any kind).
local function container_rules(ctx, c, kind, index)
    env_rules(ctx, c, kind, index)
    privilege_rules(ctx, c)
end

-- Lexically normalised path parts: "//dev/./nvidia0/" -> {"dev", "nvidia0"}; ".." drops the part
-- before it (at the root it stays at the root, as the kernel does).
local function path_parts(path)
    local parts = {}
    for part in path:gmatch("[^/]+") do
        if part == ".." then
            parts[#parts] = nil
        elseif part ~= "." then
            parts[#parts + 1] = part
        end
    end
    return parts
end

-- How the path with parts p reaches the entry with parts e (whose last part may end in "*"):
-- "is or lies under" it, "holds" it, or nil.
local function path_hits(p, e)
    for i = 1, math.min(#p, #e) do
        local want = e[i]
        if i == #e and want:sub(-1) == "*" then
            if p[i]:sub(1, #want - 1) ~= want:sub(1, -2) then
                return nil
            end
        elseif p[i] ~= want then
            return nil
        end
    end
    return #p >= #e and "is or lies under" or "holds"
end

local function host_path_rules(ctx)
    local volumes = ctx.spec.volumes
    for i = 1, type(volumes) == "table" and #gg.fields(volumes) or 0 do
        local path = gg.peek(volumes, i, "hostPath", "path") -- peek: most volumes stay untouched
        if type(path) == "string" then
            local p = path_parts(path)
            for _, entry in ipairs(guardrails_of(ctx.cfg).host_paths or DEFAULT_HOST_PATHS) do
                local how = path_hits(p, path_parts(entry))
                if how then
                    deny_unless_exempt(ctx, string.format("volume %s mounts %s from the host, which %s the GPU device and driver path %s; remove it and ask for a GPU through the device plugin",
                        tostring(volumes[i].name), path, how, entry))
                    break
                end
            end
        end
    end
end

local function node_name_rule(ctx)
    if ctx.req.background then -- the audit of a running pod: the scheduler bound it
        return
    end
    local node = ctx.spec.nodeName
    if node ~= nil and node ~= gg.null and node ~= "" and
        not requester_in(ctx.req, guardrails_of(ctx.cfg).bind_allowed or DEFAULT_BIND_ALLOWED) then
        ctx.req:deny(string.format("the pod sets spec.nodeName %s, which skips the scheduler and every GPU node taint; remove it and let the scheduler place the pod",
            tostring(node)))
    end
end

local HOST_NAMESPACES = { "hostPID", "hostIPC" }

local function host_namespace_rules(ctx)
    for _, field in ipairs(HOST_NAMESPACES) do
        if ctx.spec[field] == true and shared(ctx) then
            ctx.req:deny(string.format("the pod sets %s on a shared GPU and could reach the other pods on that GPU; remove it or use exclusive GPUs",
                field))
        end
    end
end

-- Resource names that are not NVIDIA's, told without a string call: most containers ask for
-- only these.
local PLAIN = { cpu = true, memory = true, ["ephemeral-storage"] = true }

-- resources[section][name] as k8s.get_resource(c, section, name) gives it, read from the
-- sections at hand when it is a string (the usual case), else through get_resource.
local function resource_of(c, maps, section, name)
    local v = maps[section][name]
    if type(v) == "string" then
        return v
    end
    return k8s.get_resource(c, section, name)
end

-- The NVIDIA resource names among keys (a section's, gg.fields), added to names (a set, made
-- when the first is found).
local function nvidia_names(keys, names)
    for j = 1, #keys do
        local name = keys[j]
        if not PLAIN[name] and name:sub(1, 11) == "nvidia.com/" then
            names = names or {}
            names[name] = true
        end
    end
    return names
end

-- The names come from gg.fields: a container whose sections show no NVIDIA resource needs no
-- view of its resources (most containers of a big pod: 7 % of a review of one with 30).  A
-- section that is absent, empty or not a map shows no fields: the sections are read then, and
-- one that is not a map is an error, as it always was.
local function equal_requests_rules(req, containers)
    local maps = {}
    for _, c in ipairs(containers) do
        local requested, limited = gg.fields(c, "resources", SECTIONS[1]), gg.fields(c, "resources", SECTIONS[2])
        local names = nvidia_names(limited, nvidia_names(requested))
        if names or #requested == 0 or #limited == 0 then
            local resources = c.resources or NONE
            for i = 1, #SECTIONS do
                local section = SECTIONS[i]
                local map = resources[section] or NONE
                if type(map) ~= "table" then
                    error(string.format("container %q: resources.%s is a %s, want an object", tostring(c.name),
                        section, type(map)), 0)
                end
                maps[section] = map
            end
            for name in pairs(names or NONE) do
                local r, l = resource_of(c, maps, "requests", name), resource_of(c, maps, "limits", name)
                if l == nil then
                    req:deny(string.format("container %s requests %s without a limit; set limits.%s to %s", c.name, name,
                        name, r))
                elseif r ~= nil and gg.quantity(r) ~= gg.quantity(l) then
                    req:deny(string.format("container %s requests %s %s but limits it to %s; make them equal", c.name,
                        name, r, l))
                end
            end
        end
    end
end

-- The GPU plumbing is exempt: its operator makes its pods (the GPU operator's CUDA validator asks
-- for a GPU) and cannot be told to label them, and they are no team's cost.
local function label_rules(ctx)
    for _, key in ipairs(guardrails_of(ctx.cfg).required_labels or NONE) do
        local value = k8s.label(ctx.pod, key)
        if not value or value == "" then -- an empty value attributes the cost to nobody
            if workload.exempt(ctx.pod, ctx.req.namespace, ctx.cfg) then
                return
            end
            -- On a workload's template, the path in the workload: the label goes on its pods.
            local at = ctx.req.template and (ctx.req.template .. ".metadata.labels.") or "metadata.labels."
            ctx.req:deny(string.format("GPU pods need the label %s for cost attribution; add %s%s", key, at, key))
        end
    end
end

-- Controllers that replace a pod that ends: a deadline on their pods would restart them in a loop
-- and free nothing, and the API server refuses the field in their templates ("activeDeadlineSeconds
-- in ReplicaSet is not Supported").  Operators built on them (a Notebook's or LeaderWorkerSet's
-- StatefulSet, KServe's Deployment) own their pods through them.  Anyone may write an
-- ownerReference, so a pod's owner counts only when the pod comes from that controller (its
-- service account, or the controller manager's own credentials) or is a template's (req.template,
-- whose owner gpuguard made).
local RESTARTS = {
    ReplicaSet = { api = "apps/v1", maker = "system:serviceaccount:kube-system:replicaset-controller" },
    StatefulSet = { api = "apps/v1", maker = "system:serviceaccount:kube-system:statefulset-controller" },
    DaemonSet = { api = "apps/v1", maker = "system:serviceaccount:kube-system:daemon-set-controller" },
    ReplicationController = { api = "v1", maker = "system:serviceaccount:kube-system:replication-controller" },
}
local CONTROLLER_MANAGER = "system:kube-controller-manager"

-- The kind of the controller that replaces pod when it ends (RESTARTS), or nil.
local function replaced_by(req, pod)
    local kind, ref = k8s.owner_kind(pod)
    local r = RESTARTS[kind]
    if not r or ref.apiVersion ~= r.api then
        return nil
    end
    local user = (req.user or NONE).username
    if req.template or user == r.maker or user == CONTROLLER_MANAGER then
        return kind
    end
    return nil
end

-- The class's runtime limit in seconds, the class, the limit as written and, when the pod's
-- controller replaces what ends, that controller's kind; nil when the class has none.
local function max_runtime(req, pod, cfg)
    local class = workload.class(pod, cfg)
    local c = cfg.classes and cfg.classes[class]
    if not (c and c.max_runtime) then
        return nil
    end
    return fleet.seconds(c.max_runtime), class, c.max_runtime, replaced_by(req, pod)
end

local function runtime_rules(req, pod, spec, cfg)
    local limit, class, text, restarted_by = max_runtime(req, pod, cfg)
    if not limit or restarted_by then
        return
    end
    local set = spec.activeDeadlineSeconds
    if set == nil or set > limit then
        req:deny(string.format("class %s pods run at most %s; set spec.activeDeadlineSeconds to %d or less", class, text,
            limit))
    end
end

local function create_rules(req, pod, spec, cfg)
    local ctx = new_ctx(req, pod, spec, cfg)
    node_name_rule(ctx)
    -- A GPU pod's containers, walked once, for rules that each go through all of them in turn.
    local containers = ctx.gpu and {} or nil
    for c, kind, index in k8s.containers(spec) do
        if containers then
            containers[#containers + 1] = c
        end
        container_rules(ctx, c, kind, index)
    end
    host_path_rules(ctx)
    host_namespace_rules(ctx)
    if not ctx.gpu then
        return
    end
    equal_requests_rules(req, containers)
    label_rules(ctx)
    runtime_rules(req, pod, spec, cfg)
end

-- gpuguard.io/ keys whose value differs between two label or annotation maps, sorted.
local function changed_keys(new, old)
    new = type(new) == "table" and new or NONE
    old = type(old) == "table" and old or NONE
    local out, seen = {}, {}
    for _, m in ipairs({ new, old }) do
        for k in pairs(m) do
            if type(k) == "string" and k:sub(1, #PREFIX) == PREFIX and not seen[k] then
                seen[k] = true
                if new[k] ~= old[k] then
                    out[#out + 1] = k
                end
            end
        end
    end
    table.sort(out)
    return out
end

-- A tie of fleet.gpu_ties as a word for messages and comparisons.
local function tie_text(t)
    local whose = t.pool and "pool " .. t.pool or "a GPU node label"
    if t.what == "toleration" then
        return string.format("a toleration of the GPU taint %s (pool %s)", t.key, t.pool)
    elseif t.what == "nodeSelector" then
        return string.format("the nodeSelector %s=%s (%s)", t.key, t.value, whose)
    end
    return string.format("a required node affinity term on %s=%s (%s)", t.key, t.value, whose)
end

local function metadata_update_rules(req, pod, old)
    local meta, old_meta = k8s.pod_meta(pod) or NONE, k8s.pod_meta(old) or NONE
    for _, field in ipairs({ "labels", "annotations" }) do
        for _, key in ipairs(changed_keys(meta[field], old_meta[field])) do
            req:deny(string.format("the update changes the %s %s, which gpuguard reads to place and charge the pod; leave gpuguard.io/ labels and annotations as they are",
                field == "labels" and "label" or "annotation", key))
        end
    end
end

-- What ties the pod to GPU nodes after the update and did not before (fleet.gpu_ties entries).
local function added_ties(spec, old_spec, cfg)
    local had, out = {}, {}
    for _, t in ipairs(fleet.gpu_ties(old_spec, cfg)) do
        had[tie_text(t)] = true
    end
    for _, t in ipairs(fleet.gpu_ties(spec, cfg)) do
        if not had[tie_text(t)] then
            out[#out + 1] = t
        end
    end
    return out
end

local function gated(spec)
    local gates = spec.schedulingGates
    return type(gates) == "table" and #gates > 0
end

local function gated_update_rules(req, spec, old_spec, cfg)
    if not gated(old_spec) then
        return
    end
    for _, t in ipairs(added_ties(spec, old_spec, cfg)) do
        req:deny(string.format("the pod is scheduling-gated and the update adds %s; remove it: only the queueing controller (guardrails.update_allowed) places gated pods",
            tie_text(t)))
    end
end

-- A pod without a GPU that an update gives a toleration of a GPU pool's taint (tolerations are
-- the one placement field Kubernetes lets an update add to a pod that is not gated): denied as
-- at CREATE, since a pending pod could then be scheduled onto a GPU node.  The GPU plumbing is
-- exempt, as there.
local function toleration_update_rules(req, pod, spec, old_spec, cfg)
    if gated(old_spec) -- gated_update_rules'
        or workload.wants_gpu(pod, cfg, req.namespace) or workload.exempt(pod, req.namespace, cfg) then
        return
    end
    for _, t in ipairs(added_ties(spec, old_spec, cfg)) do
        if t.what == "toleration" then
            req:deny(string.format("the update adds %s to a pod that asks for no GPU; remove it: a pod without a GPU stays off GPU nodes%s",
                tie_text(t), workload.EXEMPT_HINT))
        end
    end
end

-- pods/ephemeralcontainers: the container rules for each ephemeral container the update adds.
local function ephemeral_rules(req, pod, spec, old_spec, cfg)
    local had = {}
    for c in k8s.containers(old_spec, EPHEMERAL) do
        had[c.name] = true
    end
    local ctx = new_ctx(req, pod, spec, cfg)
    for c, kind, index in k8s.containers(spec, EPHEMERAL) do
        if not had[c.name] then
            container_rules(ctx, c, kind, index)
        end
    end
end

local function update_rules(req, pod, spec, cfg)
    local old = req.old_object
    local old_spec = old and k8s.pod_spec(old) or NONE
    if req.sub_resource == "ephemeralcontainers" then
        ephemeral_rules(req, pod, spec, old_spec, cfg)
        return
    end
    if (req.sub_resource or "") ~= "" then
        return -- status, binding, resize: nothing here reads them
    end
    if requester_in(req, guardrails_of(cfg).update_allowed or NONE) then
        return
    end
    metadata_update_rules(req, pod, old or NONE)
    gated_update_rules(req, spec, old_spec, cfg)
    toleration_update_rules(req, pod, spec, old_spec, cfg)
end

local function validate(req, pod, cfg)
    local spec = k8s.pod_spec(pod)
    if not spec then
        return
    end
    if req.operation == "UPDATE" then
        update_rules(req, pod, spec, cfg)
    else
        create_rules(req, pod, spec, cfg)
    end
end

local function mutate(req, pod, cfg)
    local spec = req.operation == "CREATE" and k8s.pod_spec(pod)
    if not spec or not workload.wants_gpu(pod, cfg, req.namespace) then
        return
    end
    local limit, class, text, restarted_by = max_runtime(req, pod, cfg)
    if restarted_by then
        req:warn(string.format("class %s: max_runtime %s not set, a %s replaces pods that end (Pods and Jobs only)",
            class, text, restarted_by))
    elseif limit and spec.activeDeadlineSeconds == nil then
        spec.activeDeadlineSeconds = limit
        req:audit("max-runtime", tostring(limit) .. "s")
    end
end

-- A list of non-empty strings, each "a <one>".
local function check_strings(list, where, one)
    if not gg.is_array(list) then
        error(string.format("%s: must be a list of %ss", where, one), 0)
    end
    for i, v in ipairs(list) do
        if type(v) ~= "string" or v == "" then
            error(string.format("%s[%d]: must be a %s", where, i, one), 0)
        end
    end
end

-- {users = [...], groups = [...]}
local function check_requesters(v, where)
    if v == nil then
        return
    end
    if type(v) ~= "table" or gg.is_array(v) then
        error(where .. ": must be a mapping with users and groups", 0)
    end
    for k, list in pairs(v) do
        if k ~= "users" and k ~= "groups" then
            error(string.format("%s.%s: unknown key (users, groups)", where, tostring(k)), 0)
        end
        check_strings(list, where .. "." .. k, "name")
    end
end

local function check(cfg)
    local g = cfg.guardrails
    if g == nil then
        return
    end
    if g.required_labels ~= nil then
        check_strings(g.required_labels, "guardrails.required_labels", "label key")
    end
    if g.host_paths ~= nil then
        check_strings(g.host_paths, "guardrails.host_paths", "path")
        for i, path in ipairs(g.host_paths) do
            local star = path:find("*", 1, true)
            if path:sub(1, 1) ~= "/" or (star and (star ~= #path or path:sub(-2, -2) == "/")) then
                error(string.format("guardrails.host_paths[%d]: %q must be an absolute path, with \"*\" only at the end of its last part",
                    i, path), 0)
            end
        end
    end
    if g.gpu_env_config_maps ~= nil then
        if not gg.is_array(g.gpu_env_config_maps) then
            error("guardrails.gpu_env_config_maps: must be a list", 0)
        end
        for i, r in ipairs(g.gpu_env_config_maps) do
            local where = string.format("guardrails.gpu_env_config_maps[%d]", i)
            if type(r) ~= "table" or not GPU_ENV[r.env] then
                error(where .. ".env: must be NVIDIA_VISIBLE_DEVICES, NVIDIA_DRIVER_CAPABILITIES or NVIDIA_MIG_CONFIG_DEVICES", 0)
            end
            for _, k in ipairs({ "key", "name_annotation" }) do
                if type(r[k]) ~= "string" or r[k] == "" then
                    error(string.format("%s.%s: must be a string", where, k), 0)
                end
            end
            if r.scheduler_name ~= nil and type(r.scheduler_name) ~= "string" then
                error(where .. ".scheduler_name: must be a string", 0)
            end
        end
    end
    check_requesters(g.bind_allowed, "guardrails.bind_allowed")
    check_requesters(g.update_allowed, "guardrails.update_allowed")
end

return {
    name = "gpu-guardrails",
    description = "Keeps GPU access through the device plugin and GPU accounting honest.",
    severity = "high",
    remember = { "validate" }, -- its validate judges the request and the configuration alone
    match = { kinds = { "Pod" }, operations = { "CREATE", "UPDATE" } },
    check = check,
    mutate = mutate,
    validate = validate,
}
