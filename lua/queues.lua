--[[
queues.lua - which queue of Kueue or KAI Scheduler a GPU workload goes to, and where the label
goes.  Pure: the configuration's `queues:` section and the object in, a decision out.

  queues:
    system: kueue            # kueue -> label kueue.x-k8s.io/queue-name; kai -> kai.scheduler/queue
    default: gpu-default     # for GPU workloads that name no queue (absent: leave them alone)
    classes: {training: gpu-training}        # by workload class, over default
    namespaces:                              # per namespace, over classes and default
      team-a:
        queue: team-a-queue
        classes: {training: team-a-train}
        allowed: [team-a-queue, team-a-train]  # queues the namespace may name (absent: any)
        allowed_priority_classes: [low]        # Kueue priority classes it may name (absent: any)
    priority_classes: {inference: high}      # Kueue only: kueue.x-k8s.io/priority-class
    controller_accounts: [...]               # users whose workload UPDATEs pass unreviewed

Where the label goes (docs/queues.md):
  kueue: the objects Kueue's integrations read it from (M.KUEUE_READS), when no controller owns
         them: a Job of a JobSet, the pods of a Job are part of their owner's workload.
  kai:   every object as it is admitted; KAI's pod grouper reads the top owner, then the pod.
]]

local gg = require "gpuguard"
local k8s = require "k8s"

local M = {}

M.LABEL = { kueue = gg.keys.kueue_queue, kai = gg.keys.kai_queue }
M.PRIORITY_LABEL = gg.keys.kueue_priority
M.KUEUE_CONTROLLER = "system:serviceaccount:kueue-system:kueue-controller-manager"

--- "<group>/<kind>" of the objects Kueue reads the queue label from ("/Pod": the core group).
M.KUEUE_READS = {
    ["batch/Job"] = true,
    ["jobset.x-k8s.io/JobSet"] = true,
    ["kubeflow.org/PyTorchJob"] = true,
    ["kubeflow.org/TFJob"] = true,
    ["kubeflow.org/MPIJob"] = true,
    ["kubeflow.org/XGBoostJob"] = true,
    ["kubeflow.org/PaddleJob"] = true,
    ["kubeflow.org/JAXJob"] = true,
    ["ray.io/RayJob"] = true,
    ["ray.io/RayCluster"] = true,
    ["leaderworkerset.x-k8s.io/LeaderWorkerSet"] = true,
    ["apps/Deployment"] = true,
    ["apps/StatefulSet"] = true,
    ["/Pod"] = true,
}

--- "<group>/<kind>" of the controllers whose objects belong to a workload Kueue manages: the
--- kinds it reads the label from, and the ReplicaSets of Deployments and the Jobs of CronJobs.
--- An object owned by anything else (a ConfigMap of the tenant's own) is its own workload.
M.KUEUE_OWNERS = setmetatable({ ["apps/ReplicaSet"] = true, ["batch/CronJob"] = true },
    { __index = M.KUEUE_READS })

local function is_name(v)
    -- A queue name is a label value and a Kubernetes object name.
    return type(v) == "string" and #v > 0 and #v <= 63 and v:find("^[a-z0-9][a-z0-9.%-]*$") ~= nil
        and v:find("[a-z0-9]$") ~= nil
end

local function check_mapping(path, t)
    if type(t) ~= "table" then
        error(path .. ": must be a mapping", 0)
    end
end

local function check_name(path, v)
    if not is_name(v) then
        error(path .. ": must be a queue name (lowercase letters, digits, '-' and '.', at most 63)", 0)
    end
end

local function check_map(path, t)
    check_mapping(path, t)
    for class, q in pairs(t) do
        check_name(path .. "." .. tostring(class), q)
    end
end

local function check_list(path, t, each)
    if type(t) ~= "table" then
        error(path .. ": must be a list", 0)
    end
    for i, v in ipairs(t) do
        each(("%s[%d]"):format(path, i), v)
    end
end

--- Raise (error with a message naming the key) when cfg.queues is malformed.
function M.check(cfg)
    local q = cfg.queues
    if q == nil then
        return
    end
    check_mapping("queues", q)
    if q.system ~= "kueue" and q.system ~= "kai" then
        error("queues.system: must be kueue or kai", 0)
    end
    if q.default ~= nil then
        check_name("queues.default", q.default)
    end
    if q.classes ~= nil then
        check_map("queues.classes", q.classes)
    end
    if q.priority_classes ~= nil then
        if q.system ~= "kueue" then
            error("queues.priority_classes: Kueue's WorkloadPriorityClass; only with system: kueue", 0)
        end
        check_map("queues.priority_classes", q.priority_classes)
    end
    if q.controller_accounts ~= nil then
        check_list("queues.controller_accounts", q.controller_accounts, function(path, v)
            if type(v) ~= "string" or v == "" then
                error(path .. ": must be a user name", 0)
            end
        end)
    end
    for ns, n in pairs(q.namespaces or {}) do
        local path = "queues.namespaces." .. tostring(ns)
        check_mapping(path, n)
        if n.queue ~= nil then
            check_name(path .. ".queue", n.queue)
        end
        if n.classes ~= nil then
            check_map(path .. ".classes", n.classes)
        end
        if n.allowed ~= nil then
            check_list(path .. ".allowed", n.allowed, check_name)
        end
        if n.allowed_priority_classes ~= nil then
            if q.system ~= "kueue" then
                error(path .. ".allowed_priority_classes: Kueue's WorkloadPriorityClass; only with system: kueue", 0)
            end
            check_list(path .. ".allowed_priority_classes", n.allowed_priority_classes, check_name)
        end
    end
end

--- Is the object one the configured system reads the queue label from?  group_kind is
--- "<group>/<kind>"; owner is the "<group>/<kind>" of its controller owner, or nil.
function M.labels_here(system, group_kind, owner)
    if system == "kai" then
        return true
    end
    -- Kueue reads the top-level object: a Job of a JobSet or CronJob, a RayCluster of a RayJob
    -- and the pods of any of them belong to their owner's workload; an owner of another kind
    -- (an ownerReference is whatever its writer put) makes no workload of Kueue's.
    return not (owner and M.KUEUE_OWNERS[owner]) and M.KUEUE_READS[group_kind] == true
end

local function allowed_list(q, namespace)
    local n = q.namespaces and q.namespaces[namespace]
    return n and n.allowed
end

--- The queue for a GPU workload of class in namespace that names none: the namespace's class
--- queue, its queue, the class queue, then default; nil when none applies.
function M.choose(q, namespace, class)
    local n = q.namespaces and q.namespaces[namespace]
    return (n and n.classes and n.classes[class]) or (n and n.queue)
        or (q.classes and q.classes[class]) or q.default
end

--- nil when namespace may name the Kueue priority class, else the denial (naming those it may).
function M.priority_refusal(q, namespace, class)
    local n = q.namespaces and q.namespaces[namespace]
    local allowed = n and n.allowed_priority_classes
    if not allowed or k8s.contains(allowed, class) then
        return nil
    end
    return ("priority class %q may not be used in namespace %s; use one of: %s"):format(class, namespace,
        table.concat(allowed, ", "))
end

--- nil when namespace may name queue, else the denial (naming the queues it may use).
function M.refusal(q, namespace, queue)
    local allowed = allowed_list(q, namespace)
    if not allowed then
        return nil
    end
    if k8s.contains(allowed, queue) then
        return nil
    end
    return ("queue %q may not be used in namespace %s; use one of: %s"):format(queue, namespace,
        table.concat(allowed, ", "))
end

return M
