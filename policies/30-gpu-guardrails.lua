--[[
30-gpu-guardrails.lua - the rules that keep GPU accounting honest.

validate:
  * a pod with no GPU request may not reach GPUs around the device plugin: no
    NVIDIA_VISIBLE_DEVICES / NVIDIA_DRIVER_CAPABILITIES environment (except the values "void"
    and "none"), and no hostPath volume under /dev/nvidia (any pod);
  * no privileged container on a shared GPU (fractional, MIG, MPS, time-sliced, HAMi, Volcano
    vGPU, KAI, a DRA MIG device or shared claim: intent.shared): privileged sees every GPU of
    the node;
  * GPU resources have requests equal to limits (a request alone, or different values, is
    refused by Kubernetes later with a less helpful message);
  * GPU pods carry the labels of guardrails.required_labels (cost attribution);
  * pods of a class with max_runtime set activeDeadlineSeconds at most that long.
mutate:
  * pods of a class with max_runtime and no activeDeadlineSeconds get it set to max_runtime.

DaemonSet pods and placement.exempt_namespaces (the GPU operator, device plugin, DCGM
exporter) are exempt from the environment and hostPath rules: they are the plumbing.

Config keys: guardrails.required_labels, classes.<class>.max_runtime, placement.exempt_namespaces.
]]

local gg = require "gpuguard"
local k8s = require "k8s"
local intent = require "intent"
local fleet = require "fleet"
local workload = require "workload"

local GPU_ENV = { "NVIDIA_VISIBLE_DEVICES", "NVIDIA_DRIVER_CAPABILITIES" }
local SECTIONS = { "requests", "limits" }
local NONE = {}

local function no_gpu_rules(req, pod, spec)
    for c in k8s.containers(spec) do
        for _, name in ipairs(GPU_ENV) do
            local value, entry = k8s.get_env(c, name)
            if entry and value ~= "void" and value ~= "none" then
                req:deny(string.format("container %s sets %s but the pod asks for no GPU; remove it and ask for a GPU (nvidia.com/gpu or gpuguard.io/gpu-fraction)",
                    c.name, name))
            end
        end
    end
end

-- Volumes that mount /dev/nvidia* from the host: each denied through req or, with req nil,
-- whether there is one.  Raises on a malformed volume list.
local function host_path_rules(req, spec)
    for _, v in ipairs(spec.volumes or NONE) do
        local path = v.hostPath and v.hostPath.path
        if type(path) == "string" and path:match("^/dev/nvidia") then
            if not req then
                return true
            end
            req:deny(string.format("volume %s mounts %s from the host; remove it and ask for a GPU through the device plugin",
                tostring(v.name), path))
        end
    end
    return false
end

local function privileged_rules(req, pod, containers, cfg)
    if not intent.shared(pod, cfg, req.namespace) then
        return
    end
    for i = 1, #containers do
        local c = containers[i]
        if c.securityContext and c.securityContext.privileged == true then
            req:deny(string.format("container %s is privileged on a shared GPU and would see every GPU of the node; drop privileged or use exclusive GPUs",
                c.name))
        end
    end
end

-- Resource names that are not NVIDIA's, told without a string call: most containers ask for
-- only these.
local PLAIN = { cpu = true, memory = true, ["ephemeral-storage"] = true }

local function equal_requests_rules(req, containers)
    for i = 1, #containers do
        local c = containers[i]
        local names -- made only for a container with NVIDIA resources, as most have none
        for j = 1, #SECTIONS do
            for name in pairs(c.resources and c.resources[SECTIONS[j]] or NONE) do
                if not PLAIN[name] and name:sub(1, 11) == "nvidia.com/" then -- no pattern
                    names = names or {}
                    names[name] = true
                end
            end
        end
        for name in pairs(names or NONE) do
            local r, l = k8s.get_resource(c, "requests", name), k8s.get_resource(c, "limits", name)
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

local function label_rules(req, pod, cfg)
    local required = cfg.guardrails and cfg.guardrails.required_labels or {}
    local i, key = 1, required[1]
    while key ~= nil do -- not # nor ipairs: on a configuration list each is a C call
        if not k8s.label(pod, key) then
            req:deny(string.format("GPU pods need the label %s for cost attribution; add metadata.labels.%s", key, key))
        end
        i = i + 1
        key = required[i]
    end
end

local function max_runtime(pod, cfg)
    local class = workload.class(pod, cfg)
    local c = cfg.classes and cfg.classes[class]
    return c and c.max_runtime and fleet.seconds(c.max_runtime), class, c and c.max_runtime
end

local function runtime_rules(req, pod, spec, cfg)
    local limit, class, text = max_runtime(pod, cfg)
    if not limit then
        return
    end
    local set = spec.activeDeadlineSeconds
    if set == nil or set > limit then
        req:deny(string.format("class %s pods run at most %s; set spec.activeDeadlineSeconds to %d or less", class, text,
            limit))
    end
end

local function validate(req, pod, cfg)
    local spec = k8s.pod_spec(pod)
    if not spec then
        return
    end
    if not workload.wants_gpu(pod, cfg, req.namespace) then
        if not workload.exempt(pod, req.namespace, cfg) then
            no_gpu_rules(req, pod, spec)
            host_path_rules(req, spec)
        end
        return
    end
    -- A GPU pod asks exempt (which reads ownerReferences) only when the rule could act: a
    -- matching volume, or a malformed list the rule would raise on.
    local ok, found = pcall(host_path_rules, nil, spec)
    if (not ok or found) and not workload.exempt(pod, req.namespace, cfg) then
        host_path_rules(req, spec)
    end
    -- The containers walked once, for rules that each go through all of them in turn.
    local containers = k8s.all_containers(spec)
    privileged_rules(req, pod, containers, cfg)
    equal_requests_rules(req, containers)
    label_rules(req, pod, cfg)
    runtime_rules(req, pod, spec, cfg)
end

local function mutate(req, pod, cfg)
    local spec = k8s.pod_spec(pod)
    if not spec or not workload.wants_gpu(pod, cfg, req.namespace) then
        return
    end
    local limit = max_runtime(pod, cfg)
    if limit and spec.activeDeadlineSeconds == nil then
        spec.activeDeadlineSeconds = limit
        req:audit("max-runtime", tostring(limit) .. "s")
    end
end

return {
    name = "gpu-guardrails",
    description = "Keeps GPU access through the device plugin and GPU accounting honest.",
    match = { kinds = { "Pod" }, operations = { "CREATE" } },
    check = function(cfg)
        local g = cfg.guardrails
        if g ~= nil and g.required_labels ~= nil then
            if not gg.is_array(g.required_labels) then
                error("guardrails.required_labels: must be a list of label keys", 0)
            end
            for i, key in ipairs(g.required_labels) do
                if type(key) ~= "string" or key == "" then
                    error(string.format("guardrails.required_labels[%d]: must be a label key", i), 0)
                end
            end
        end
    end,
    mutate = mutate,
    validate = validate,
}
