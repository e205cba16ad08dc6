--[[
workload.lua - what a pod is and what GPU it asks for: its workload class, the sharing mode it
requests, and its GPU intent per container (whole GPUs, a fraction, an amount of GPU memory).

Pod metadata read here:
  label      gpuguard.io/workload-class   training | inference | batch | interactive | ...
                                          (else the class of what the pod is: M.WORKLOADS)
  annotation gpuguard.io/sharing          a sharing mode the pod asks for (see fleet.MODES)
  annotation gpuguard.io/gpu-fraction     "0.25": part of one GPU, 0 < f <= 1 (whole pod)
  annotation gpuguard.io/gpu-memory       "18Gi": GPU memory (whole pod)
  annotation gpuguard.io/gpu-fraction.<container>, gpuguard.io/gpu-memory.<container>
                                          the same for one container of a pod with several

A pod-level fraction or memory goes to the container that already asks for nvidia.com/gpu when
exactly one does, else to the first regular container.  A per-container annotation that names no
regular container, and nvidia.com/gpu with a request different from its limit, are errors (the
intent is nil and a message that says what to change), never guessed.

State: the answers that cannot change while policies edit a pod (its class, whether it wants a
GPU, whether it is exempt) are memoised per pod table, so that every policy of a request, in
mutate and in validate, gets the first answer without computing it again (the key is the pod's
read-only view, gpuguard.frozen, which validate's policies are given).  Safe because the engine
decodes a new pod table for each request: an answer is never seen by another request, and the
memo is weak-keyed, so it goes with the pod.  compute_class, compute_wants_gpu and compute_exempt answer afresh.
Must not: change the pod.
]]

local k8s = require "k8s"
local gpu = require "gpu"
local quota = require "quota"
local intent = require "intent"
local fleet = require "fleet"
local gg = require "gpuguard"

local M = {}

-- Arguments of the calls below, made once (the callees only read these tables).
local REGULAR = { regular = true }
local NONE = {}
local GPU = "nvidia.com/gpu"
local CONTAINER_LISTS = { "initContainers", "containers" }

-- The memoised answers of each pod table (see the header), by its read-only view: the same
-- key for the pod mutate edits and the pod validate reads.
local memo = setmetatable({}, { __mode = "k" })

local function memo_of(pod)
    return k8s.request_memo(memo, pod)
end

-- memo_of(pod)[key], from compute(pod, a, b) the first time.
local function remembered(key, compute, pod, a, b)
    local m = memo_of(pod)
    if m[key] == nil then
        m[key] = compute(pod, a, b)
    end
    return m[key]
end

M.CLASS_LABEL = gg.keys.workload_class
M.SHARING_ANNOTATION = "gpuguard.io/sharing"
M.FRACTION = intent.FRACTION
M.MEMORY = intent.MEMORY

--[[
What a workload is, from what its operator puts on the pods it creates: the first row with a
matching controller owner ("<API group>/<kind>") or label (any value when true, else that value)
gives the class, and the reason is the owner's kind or the row's name.  Rows before the Job rule
below, so a JobSet's pods (owned by a batch/v1 Job) are training.  Where each label comes from
upstream: docs/gpu-policies.md, "Workload classes".
]]
M.WORKLOADS = {
    { class = "inference", name = "LeaderWorkerSet",
      owners = { "leaderworkerset.x-k8s.io/LeaderWorkerSet" },
      labels = { ["leaderworkerset.sigs.k8s.io/name"] = true } },
    { class = "inference", name = "RayService",
      owners = { "ray.io/RayService" },
      labels = { ["ray.io/serve"] = true, ["ray.io/originated-from-crd"] = "RayService" } },
    { class = "inference", name = "InferenceService",
      owners = { "serving.kserve.io/InferenceService" },
      labels = { ["serving.kserve.io/inferenceservice"] = true } },
    { class = "training", name = "RayJob",
      owners = { "ray.io/RayJob" },
      labels = { ["ray.io/originated-from-crd"] = "RayJob" } },
    { class = "training", name = "TrainJob",
      owners = { "trainer.kubeflow.org/TrainJob" },
      labels = { ["trainer.kubeflow.org/trainjob-name"] = true } },
    { class = "training", name = "JobSet",
      owners = { "jobset.x-k8s.io/JobSet" },
      labels = { ["jobset.sigs.k8s.io/jobset-name"] = true } },
    { class = "training", name = "MPIJob",
      owners = { "kubeflow.org/MPIJob" },
      labels = { ["training.kubeflow.org/operator-name"] = "mpi-operator" } },
    { class = "training", name = "Kubeflow training job",
      owners = { "kubeflow.org/PyTorchJob", "kubeflow.org/TFJob", "kubeflow.org/XGBoostJob",
                 "kubeflow.org/PaddleJob", "kubeflow.org/JAXJob" },
      labels = { ["training.kubeflow.org/job-name"] = true, ["training.kubeflow.org/replica-type"] = true } },
    { class = "training", name = "Volcano Job",
      owners = { "batch.volcano.sh/Job" },
      labels = { ["volcano.sh/job-name"] = true } },
    { class = "interactive", name = "Kubeflow Notebook",
      owners = { "kubeflow.org/Notebook" },
      labels = { ["notebook-name"] = true } },
}

-- Rows by owner, "<group>/<kind>" -> row, built once from the table above.
local BY_OWNER = {}
for _, row in ipairs(M.WORKLOADS) do
    for _, owner in ipairs(row.owners) do
        BY_OWNER[owner] = row
    end
end

-- The row a pod's labels match, or nil.
local function row_by_labels(pod)
    local meta = k8s.pod_meta(pod)
    local labels = meta and meta.labels
    if type(labels) ~= "table" then
        return nil
    end
    for _, row in ipairs(M.WORKLOADS) do
        for key, want in pairs(row.labels) do
            local v = labels[key]
            if type(v) == "string" and (want == true or v == want) then
                return row
            end
        end
    end
    return nil
end

-- Jupyter hints: labels of JupyterHub's single-user servers, or a Jupyter image.
local function looks_like_notebook(pod)
    if k8s.label(pod, "app") == "jupyter" or k8s.label(pod, "app.kubernetes.io/name") == "jupyterhub" or
        k8s.label(pod, "component") == "singleuser-server" then
        return true
    end
    local spec = k8s.pod_spec(pod)
    for c in k8s.containers(spec or NONE, REGULAR) do
        local image = type(c.image) == "string" and c.image:lower() or ""
        if image:find("jupyter", 1, true) or image:find("notebook", 1, true) then
            return true
        end
    end
    return false
end

--[[
The workload class of a pod and how it was found: the label gpuguard.io/workload-class; else the
first row of M.WORKLOADS whose owner or labels match (reason: the owner's kind, or the row's
name); else owned by a batch/v1 Job or CronJob -> batch; Jupyter hints -> interactive; else
cfg.default_class (or "batch").  Returns class, reason.  Whether the pod's namespace may use the
class is class_allowed's question.
]]
function M.class(pod, cfg)
    local m = memo_of(pod)
    if m.class == nil then
        m.class, m.class_reason = M.compute_class(pod, cfg)
    end
    return m.class, m.class_reason
end

--- M.class without the per-request memory.
function M.compute_class(pod, cfg)
    local label = k8s.label(pod, M.CLASS_LABEL)
    if label then
        return label, "label " .. M.CLASS_LABEL
    end
    local owner, ref = k8s.owner_kind(pod)
    local group = ref and type(ref.apiVersion) == "string" and ref.apiVersion:match("^(.*)/") or ""
    local row = owner and BY_OWNER[group .. "/" .. owner]
    if row then
        return row.class, owner
    end
    row = row_by_labels(pod)
    if row then
        return row.class, row.name
    end
    if (owner == "Job" or owner == "CronJob") and group == "batch" then
        return "batch", "owned by a " .. owner
    end
    if looks_like_notebook(pod) then
        return "interactive", "notebook"
    end
    return cfg.default_class or "batch", "default class"
end

--[[
Whether pods in namespace may be of class (found as why says): true when the configuration has
no classes, or has this one without classes.<class>.namespaces or with the namespace in it.
Otherwise false and a message naming the classes the namespace may use: a class label, and the
labels operators put on pods, are the user's to set, so an unknown class is no way around the
limits of a known one.
]]
function M.class_allowed(class, why, namespace, cfg)
    local classes = cfg.classes
    if classes == nil then
        return true
    end
    local ns = namespace or ""
    local problem
    if classes[class] == nil then
        problem = "is not a class of the configuration"
    elseif not fleet.class_for(cfg, class, ns) then
        problem = "is not for namespace " .. ns
    else
        return true
    end
    local usable = fleet.classes_for(cfg, ns)
    local msg = string.format("class %s (%s) %s", class, why, problem)
    if #usable == 0 then
        return false, string.format("%s, and no class is for namespace %s; ask the platform team to add it to "
            .. "classes.<name>.namespaces", msg, ns)
    end
    return false, string.format("%s; set the label %s to one of %s", msg, M.CLASS_LABEL, table.concat(usable, ", "))
end

-- Namespaces of the GPU plumbing (operator, device plugin) when placement.exempt_namespaces is
-- not set.
local DEFAULT_EXEMPT = { "gpu-operator", "nvidia-device-plugin", "kube-system" }

--- True for a pod of the GPU plumbing, which the placement and guardrail rules leave alone: one
--- in placement.exempt_namespaces (default gpu-operator, nvidia-device-plugin, kube-system), or
--- one that runs as a service account of placement.exempt_service_accounts ("namespace/name").
--- Never by owner: anyone may create a DaemonSet, and an ownerReference is whatever the creator
--- wrote.  namespace is the request's (req.namespace).
function M.exempt(pod, namespace, cfg)
    return remembered("exempt", M.compute_exempt, pod, namespace, cfg)
end

--- Said after a denial that exempt pods are spared: for GPU plumbing (a driver, device plugin or
--- exporter) the fix is where it runs, not dropping what it needs.
M.EXEMPT_HINT = "; GPU plumbing (drivers, device plugins, exporters) belongs in a namespace of "
    .. "placement.exempt_namespaces or runs as one of placement.exempt_service_accounts"

--- M.exempt without the per-request memory.
function M.compute_exempt(pod, namespace, cfg)
    local p = cfg.placement
    if k8s.contains(p and p.exempt_namespaces or DEFAULT_EXEMPT, namespace) then
        return true
    end
    local accounts = p and p.exempt_service_accounts
    if not accounts then
        return false
    end
    -- A pod may name only a service account of its own namespace (which must exist there).
    local spec = k8s.pod_spec(pod) or NONE
    local sa = spec.serviceAccountName or spec.serviceAccount
    local id = tostring(namespace) .. "/" .. ((type(sa) == "string" and sa ~= "") and sa or "default")
    return k8s.contains(accounts, id)
end

--- The sharing mode the pod asks for with gpuguard.io/sharing, or nil.
function M.asked_sharing(pod)
    return k8s.annotation(pod, M.SHARING_ANNOTATION)
end

-- Memory of a "18Gi" annotation in milli-bytes; nil and a message when malformed.
local function memory_of(text, key)
    local milli, msg = gg.quantity(text)
    if not milli or milli <= 0 then
        return nil, string.format("annotation %s: %q is not an amount of memory such as 18Gi%s", key, text,
            msg and "" or "")
    end
    return milli
end

local FRACTION_OPTS = { allow_above_one = true }

local function fraction_of(text, key)
    local milli, msg = quota.parse_fraction(text, FRACTION_OPTS)
    if not milli then
        return nil, string.format("annotation %s: %s", key, msg)
    end
    return milli
end

-- k8s.get_resource(c, section, "nvidia.com/gpu"), read without filling c when it is a string
-- or absent (anything else goes through get_resource, which converts it or says what is wrong).
local function gpu_resource(c, section)
    local v = gg.peek(c, "resources", section, GPU)
    if v == nil or type(v) == "string" then
        return v
    end
    return k8s.get_resource(c, section, GPU)
end

-- The container a pod-level fraction or memory belongs to, from the list of regular ones.  What
-- it reads of container i's nvidia.com/gpu goes to limits[i] and requests[i] (false for none),
-- where intent finds it again.
local function pod_level_target(regular, limits, requests)
    local with_gpu
    for i = 1, #regular do
        local c = regular[i]
        limits[i] = gpu_resource(c, "limits") or false
        if not limits[i] then
            requests[i] = gpu_resource(c, "requests") or false
        end
        if limits[i] or requests[i] then
            if with_gpu then
                return nil -- several: ambiguous, the per-container form is needed
            end
            with_gpu = c
        end
    end
    if with_gpu or #regular == 1 then
        return with_gpu or regular[1]
    end
    -- None asks for nvidia.com/gpu: the one container that asks for a GPU otherwise, as the
    -- container 10-gpu-sharing rewrote does on the API server's second call (a replica, a MIG
    -- device), so that the second call decides for the same container; else the first.
    local only
    for i = 1, #regular do
        local keys = gg.fields(regular[i], "resources", "limits") -- gpuguard writes both sections
        for k = 1, #keys do
            if gpu.is_gpu_resource(keys[k]) then
                if only then
                    return regular[1]
                end
                only = regular[i]
                break
            end
        end
    end
    return only or regular[1]
end

-- k8s.annotation(pod, key), read from annotations (those of meta, the pod template's metadata,
-- as a table) when that template is the object itself, a Pod: no second walk to them.
local function annotation(pod, meta, annotations, key)
    if meta ~= pod.metadata then
        return k8s.annotation(pod, key) -- a controller: its own annotations, not the template's
    end
    local v = annotations[key]
    if v ~= gg.null then
        return v
    end
end

-- The intent entry of container c, added to out when new.
local function entry(out, by_name, c)
    local e = by_name[c.name]
    if not e then
        e = { container = c }
        by_name[c.name] = e
        out[#out + 1] = e
    end
    return e
end

--[[
The GPU intent of a pod: a list of { container = c, fraction_milli = n or nil, memory_milli = n
or nil, whole = n or nil } for every container that asks for a GPU by annotation or by
nvidia.com/gpu; an empty list for a pod that asks for none.  Returns nil and a message that says
what to change for a malformed annotation.  (M.intent is this and a word to wants_gpu.)
]]
local function intent_of(pod)
    local spec = k8s.pod_spec(pod)
    if not spec then
        return {}
    end
    -- The regular containers (spec.containers without nulls, as k8s.containers(spec, REGULAR)
    -- yields them, without its option checks), walked once and then read as a list.
    local regular, names, is_regular = {}, {}, {}
    local list = spec.containers
    for _, c in ipairs(type(list) == "table" and list or NONE) do
        if type(c) == "table" then
            local name = gg.peek(c, "name") -- peek: most containers stay untouched
            regular[#regular + 1] = c
            names[#regular] = name
            is_regular[name] = true
        end
    end
    -- A per-container annotation must name a regular container (a typo would drop the request).
    local meta = k8s.pod_meta(pod)
    local annotations = meta and meta.annotations
    if type(annotations) ~= "table" then
        annotations = NONE
    end
    local stray, asked = nil, nil -- asked: the containers a per-container annotation names
    for key in pairs(annotations) do
        -- The prefix test first: most pods carry many annotations and none of ours; then one
        -- pattern from after the prefix for "fraction.<container>" and "memory.<container>".
        local word, target
        if type(key) == "string" and key:sub(1, 16) == "gpuguard.io/gpu-" then
            word, target = key:match("^(%a+)%.(.+)$", 17)
        end
        if word == "fraction" or word == "memory" then
            asked = asked or {}
            asked[target] = true
            if not is_regular[target] then
                stray = stray or {}
                stray[#stray + 1] = key
            end
        end
    end
    if stray then
        table.sort(stray)
        local shown = {}
        for i = 1, #regular do
            shown[i] = tostring(names[i])
        end
        return nil, string.format("annotation %s names no container of the pod; use one of %s", stray[1],
            table.concat(shown, ", "))
    end
    local out, by_name, limits, requests = {}, {}, NONE, NONE
    local pod_fraction = annotation(pod, meta, annotations, M.FRACTION)
    local pod_memory = annotation(pod, meta, annotations, M.MEMORY)
    if pod_fraction or pod_memory then
        limits, requests = {}, {} -- filled here for the loop below, which reads the rest
        local target = pod_level_target(regular, limits, requests)
        if not target then
            return nil, string.format("several containers ask for nvidia.com/gpu; use %s.<container> or %s.<container>",
                M.FRACTION, M.MEMORY)
        end
        local e = entry(out, by_name, target)
        local msg
        if pod_fraction then
            e.fraction_milli, msg = fraction_of(pod_fraction, M.FRACTION)
            if not e.fraction_milli then
                return nil, msg
            end
        end
        if pod_memory then
            e.memory_milli, msg = memory_of(pod_memory, M.MEMORY)
            if not e.memory_milli then
                return nil, msg
            end
        end
    end
    -- A controller's values come from its own annotations (see annotation): every container
    -- is looked up there; a Pod's only for the names its annotations hold (the pattern above
    -- takes no empty name, nor does it see a name that is not a string: those are looked up).
    local every = asked and meta ~= pod.metadata
    for i = 1, #regular do
        local c = regular[i]
        local fkey, mkey, f, m
        if asked and (every or asked[names[i]] or names[i] == "" or type(names[i]) ~= "string") then
            fkey, mkey = M.FRACTION .. "." .. names[i], M.MEMORY .. "." .. names[i]
            f, m = annotation(pod, meta, annotations, fkey), annotation(pod, meta, annotations, mkey)
        end
        local msg
        if f then
            local e = entry(out, by_name, c)
            e.fraction_milli, msg = fraction_of(f, fkey)
            if not e.fraction_milli then
                return nil, msg
            end
        end
        if m then
            local e = entry(out, by_name, c)
            e.memory_milli, msg = memory_of(m, mkey)
            if not e.memory_milli then
                return nil, msg
            end
        end
        local limit, request = limits[i], requests[i]
        if limit == nil then
            limit = gpu_resource(c, "limits")
        end
        if request == nil then
            request = gpu_resource(c, "requests")
        end
        if limit and request and gg.quantity(limit) ~= gg.quantity(request) then
            -- Which one was meant is not ours to guess (Kubernetes refuses the pod anyway).
            return nil, string.format("container %s requests nvidia.com/gpu %s but limits it to %s; make them equal",
                c.name, request, limit)
        end
        local whole = limit or request
        if whole then
            local n = gg.quantity(whole)
            if not n or n % 1000 ~= 0 or n < 0 then
                return nil, string.format("container %s: nvidia.com/gpu must be a whole number, got %s", c.name, whole)
            end
            if n > 0 then
                entry(out, by_name, c).whole = n // 1000
            end
        end
    end
    return out
end

--- The GPU intent of a pod (intent_of).  When it shows the pod asks for a GPU, that settles
--- wants_gpu for the request: 10-gpu-sharing edits the pod only after asking, and whatever it
--- writes keeps the pod asking for a GPU.
function M.intent(pod)
    local out, msg = intent_of(pod)
    if out == nil or #out > 0 then
        M.settle_wants_gpu(pod)
    end
    return out, msg
end

--- Settle wants_gpu as true for the request.  Only for a caller that has found the pod asking
--- for a GPU exactly as wants_gpu would, in a way that stands for the pod as it will be (M.intent;
--- 10-gpu-sharing's pass-through of a pod written for a backend, whose claims and resources it
--- never removes): a GPU pod is spared some checks of pods without GPUs (20-gpu-placement's GPU
--- ties, 30-gpu-guardrails' toleration rules), so a pod settled wrongly would escape them.
function M.settle_wants_gpu(pod)
    local m = memo_of(pod)
    if m.wants_gpu == nil then
        m.wants_gpu = true
    end
end

--[[
A container outside asks (M.intent's entries) that holds shared GPU replicas of its own, as a
message that says what to change; nil when none does.  The charge 10-gpu-sharing records covers
the containers it decides; a replica it did not decide would be held against that charge, whose
floor is one milli-GPU a replica (a fraction's).  Replicas are nvidia.com/gpu.shared and
nvidia.com/mig-<profile>.shared, and nvidia.com/gpu where pool shares GPUs under that name.
]]
function M.stray_replicas(pod, asks, pool)
    local spec = k8s.pod_spec(pod)
    local decided = {}
    for i = 1, #asks do
        decided[asks[i].container] = true
    end
    local gpu_is_replica = intent.gpu_means(pool) == "replica"
    -- The lists walked as intent_of walks them (k8s.containers' option checks cost more than
    -- the walk): init containers, sidecars among them, and regular ones; ephemeral ones hold no
    -- resources.
    for f = 1, #CONTAINER_LISTS do
        local list = spec[CONTAINER_LISTS[f]]
        for _, c in ipairs(type(list) == "table" and list or NONE) do
            if type(c) == "table" and not decided[c] then
                local ok, items = pcall(gpu.requested, c)
                if not ok then
                    return (tostring(items):gsub("^.-gpu%.requested: ", ""))
                end
                for _, it in ipairs(items) do
                    if it.kind == "shared" or (gpu_is_replica and it.resource == GPU) then
                        local name = tostring(c.name)
                        -- gpuguard's per-container annotations name regular containers only
                        local instead = f == 1 and "move it to a regular container"
                            or string.format("ask for its GPU through gpuguard as well (%s.%s)", M.FRACTION, name)
                        return string.format("container %s asks for %s itself, beside the GPU share gpuguard decides for this pod; %s, or for every GPU of the pod as resources without gpuguard's annotations",
                            name, it.resource, instead)
                    end
                end
            end
        end
    end
    return nil
end

--- True when the pod asks for a GPU in any way gpuguard or a device plugin understands, in any
--- dialect of intent.lua (a malformed request counts as asking).  cfg and namespace (the
--- request's) let it read DRA claims; the first answer of a request is kept.
function M.wants_gpu(pod, cfg, namespace)
    return remembered("wants_gpu", M.compute_wants_gpu, pod, cfg, namespace)
end

--- M.wants_gpu without the per-request memory.
function M.compute_wants_gpu(pod, cfg, namespace)
    local spec = k8s.pod_spec(pod)
    if not spec then
        return false
    end
    local wanted = intent_of(pod)
    if wanted == nil or #wanted > 0 then
        return true
    end
    return intent.wants_gpu(pod, cfg or NONE, namespace)
end

return M
