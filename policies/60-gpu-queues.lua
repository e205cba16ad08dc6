--[[
60-gpu-queues.lua - route GPU workloads to a queue of Kueue or KAI Scheduler.

Runs on the workload objects themselves (a Job, a JobSet, a RayJob: the server and
`gpuguard check` put each workload through the policies before its templates) and on Pods.

mutate:   on CREATE, a GPU workload that names no queue gets the queue label of queues.system
          (lua/queues.lua: the namespace's class queue, its queue, the class queue, default),
          on the objects that system reads it from; with Kueue, the priority-class label of
          queues.priority_classes for its class too.  A queue already named is kept.
validate: a workload naming a queue its namespace may not use (queues.namespaces.<ns>.allowed)
          is denied with the queues it may use; with Kueue, so is one naming a priority class
          its namespace may not use (queues.namespaces.<ns>.allowed_priority_classes).  An object
          is left to its owner's workload only when that owner is of a kind Kueue manages.

Config keys: queues (docs/queues.md).
]]

local k8s = require "k8s"
local queues = require "queues"
local workload = require "workload"

-- A template as the pod its controller makes, for the class and GPU questions.
local function template_pod(obj, t)
    return {
        apiVersion = "v1",
        kind = "Pod",
        metadata = { labels = t.meta and t.meta.labels, annotations = t.meta and t.meta.annotations,
                     ownerReferences = { { apiVersion = obj.apiVersion, kind = obj.kind,
                                           name = obj.metadata and obj.metadata.name,
                                           controller = true } } },
        spec = t.spec,
    }
end

-- The pod of the object that asks for a GPU (the object itself for a Pod), or nil: where the
-- "is this a GPU workload" question is asked, once (in any dialect: intent.lua).
local function gpu_pod(req, obj, cfg)
    if req.kind == "Pod" and req.group == "" then
        return workload.wants_gpu(obj, cfg, req.namespace) and obj or nil
    end
    for _, t in ipairs(k8s.pod_templates(obj)) do
        local pod = template_pod(obj, t)
        if workload.compute_wants_gpu(pod, cfg, req.namespace) then
            return pod
        end
    end
    return nil
end

-- The label key when this object carries the queue, else nil.
local function queue_label(req, obj, q)
    if not q then
        return nil -- no queues configured: the object's owner is not read
    end
    local kind, ref = k8s.owner_kind(obj)
    local owner = kind and (type(ref.apiVersion) == "string" and ref.apiVersion:match("^(.*)/") or "") .. "/" .. kind
    if queues.labels_here(q.system, req.group .. "/" .. req.kind, owner) then
        return queues.LABEL[q.system]
    end
    return nil
end

local function mutate(req, obj, cfg)
    local q = cfg.queues
    local key = queue_label(req, obj, q)
    if not key or req.operation ~= "CREATE" or k8s.label(obj, key) ~= nil then
        return
    end
    local pod = gpu_pod(req, obj, cfg)
    if not pod then
        return
    end
    local class = workload.compute_class(pod, cfg)
    local queue = queues.choose(q, req.namespace, class)
    if queue then
        k8s.set_label(obj, key, queue)
        req:audit("queue", queue)
    end
    local priority = q.system == "kueue" and q.priority_classes and q.priority_classes[class]
    if priority and k8s.label(obj, queues.PRIORITY_LABEL) == nil then
        k8s.set_label(obj, queues.PRIORITY_LABEL, priority)
    end
end

local function validate(req, obj, cfg)
    local q = cfg.queues
    local key = queue_label(req, obj, q)
    local named = key and k8s.label(obj, key)
    local why = named and queues.refusal(q, req.namespace, named)
    if why then
        req:deny(string.format("%s; set the label %s to one of them or remove it", why, key))
    end
    local priority = key and q.system == "kueue" and k8s.label(obj, queues.PRIORITY_LABEL)
    why = priority and queues.priority_refusal(q, req.namespace, priority)
    if why then
        req:deny(string.format("%s; set the label %s to one of them or remove it", why, queues.PRIORITY_LABEL))
    end
end

return {
    name = "gpu-queues",
    description = "GPU workloads go to the queue of Kueue or KAI their class and namespace name.",
    match = {
        kinds = { "Pod", "Job", "JobSet", "PyTorchJob", "TFJob", "MPIJob", "XGBoostJob", "PaddleJob",
                  "JAXJob", "RayJob", "RayCluster", "RayService", "LeaderWorkerSet", "Deployment",
                  "StatefulSet", "ReplicaSet", "DaemonSet", "ReplicationController", "CronJob",
                  "Notebook", "InferenceService" },
        operations = { "CREATE", "UPDATE" },
    },
    remember = { "validate" }, -- its validate judges the request and the configuration alone
    check = queues.check,
    mutate = mutate,
    validate = validate,
}
