--[[
test_k8s.lua - tests of lua/k8s.lua, run inside the policy sandbox.

Returns a table mapping test names to functions; a test fails by raising an error.  Fixtures
are built as the engine decodes JSON: json{...} marks every table as an array or an object.
]]

local gg = require "gpuguard"
local k8s = require "k8s"
local testlib = require "testlib"

-- Helpers -------------------------------------------------------------------------------------

local eq, same, truthy, raises = testlib.eq, testlib.same, testlib.truthy, testlib.raises
local json, copy, all_marked = testlib.json, testlib.copy, testlib.all_marked
local readonly = testlib.readonly

local function paths(templates)
    local out = {}
    for i, t in ipairs(templates) do
        out[i] = t.path
    end
    return out
end

-- Fixtures ------------------------------------------------------------------------------------

local GPU = "nvidia.com/gpu"
local GPU_TAINT = { key = GPU, operator = "Exists", effect = "NoSchedule" }

local function gpu_container(name, gpus)
    return {
        name = name,
        image = "nvcr.io/nvidia/pytorch:24.05-py3",
        resources = { limits = { [GPU] = gpus or "1", memory = "32Gi" },
                      requests = { cpu = "4", memory = "32Gi" } },
    }
end

local function template(name, gpus)
    return {
        metadata = { labels = { app = name } },
        spec = { containers = { gpu_container(name, gpus) }, restartPolicy = "Never" },
    }
end

local function gpu_pod()
    return json {
        apiVersion = "v1",
        kind = "Pod",
        metadata = { name = "llm-0", namespace = "team-a",
                     labels = { app = "llm", ["gpuguard.io/workload-class"] = "inference" },
                     annotations = { ["gpuguard.io/gpu-memory"] = "18Gi" } },
        spec = {
            containers = { gpu_container("server") },
            tolerations = {
                { key = "node.kubernetes.io/not-ready", operator = "Exists",
                  effect = "NoExecute", tolerationSeconds = 300 },
            },
        },
    }
end

local function deployment()
    return json {
        apiVersion = "apps/v1",
        kind = "Deployment",
        metadata = { name = "llm", namespace = "team-a", labels = { tier = "serving" } },
        spec = {
            replicas = 2,
            selector = { matchLabels = { app = "llm" } },
            template = template("llm"),
        },
    }
end

-- The kind of mutation a GPU policy does, on every template of obj.
local function gpu_mutation(obj)
    local changed = false
    for _, t in ipairs(k8s.pod_templates(obj)) do
        for c in k8s.containers(t.spec, { init = true, regular = true }) do
            local gpus = k8s.get_resource(c, "limits", GPU)
            if gpus then
                changed = k8s.set_resource(c, "requests", GPU, gpus) or changed
                changed = k8s.set_env(c, "NVIDIA_DRIVER_CAPABILITIES", "compute,utility")
                    or changed
                changed = k8s.add_toleration(t.spec, GPU_TAINT) or changed
                changed = k8s.set_node_selector(t.spec, "nvidia.com/gpu.present", "true")
                    or changed
                changed = k8s.set_label(t.template, "gpuguard.io/managed", "true") or changed
                changed = k8s.set_annotation(t.template, "gpuguard.io/decision",
                                             "exclusive: whole GPU requested") or changed
            end
        end
    end
    return changed
end

local T = {}

-- Constructors --------------------------------------------------------------------------------

T["array, object and null are the engine's"] = function()
    truthy(gg.is_array(k8s.array()), "k8s.array()")
    truthy(gg.is_object(k8s.object({ a = 1 })), "k8s.object{a=1}")
    same(k8s.null, gg.null, "k8s.null")
    truthy(k8s.is_null(nil) and k8s.is_null(gg.null), "is_null(nil), is_null(null)")
    eq(k8s.is_null(""), false, "is_null('')")
    eq(k8s.is_null(0), false, "is_null(0)")
end

-- pod_spec / pod_meta -------------------------------------------------------------------------

T["pod_spec of a Pod"] = function()
    local pod = gpu_pod()
    same(k8s.pod_spec(pod), pod.spec, "pod_spec(pod)")
end

T["pod_spec of each built-in controller"] = function()
    for _, case in ipairs({
        { "apps/v1", "Deployment" }, { "apps/v1", "ReplicaSet" }, { "apps/v1", "StatefulSet" },
        { "apps/v1", "DaemonSet" }, { "batch/v1", "Job" }, { "v1", "ReplicationController" },
        { "extensions/v1beta1", "Deployment" }, { "extensions/v1beta1", "DaemonSet" },
    }) do
        local obj = json { apiVersion = case[1], kind = case[2], metadata = { name = "x" },
                           spec = { template = template("x") } }
        same(k8s.pod_spec(obj), obj.spec.template.spec, "pod_spec of " .. case[1] .. " " .. case[2])
    end
end

T["pod_spec of a CronJob"] = function()
    local cj = json {
        apiVersion = "batch/v1", kind = "CronJob", metadata = { name = "nightly-eval" },
        spec = { schedule = "0 3 * * *",
                 jobTemplate = { spec = { backoffLimit = 2, template = template("eval") } } },
    }
    same(k8s.pod_spec(cj), cj.spec.jobTemplate.spec.template.spec, "pod_spec(cronjob)")
    same(k8s.pod_meta(cj), cj.spec.jobTemplate.spec.template.metadata, "pod_meta(cronjob)")
end

T["pod_spec of a PodTemplate"] = function()
    local pt = json { apiVersion = "v1", kind = "PodTemplate", metadata = { name = "gpu" },
                      template = template("gpu") }
    same(k8s.pod_spec(pt), pt.template.spec, "pod_spec(PodTemplate)")
end

T["pod_spec without apiVersion uses the kind's group"] = function()
    local job = json { kind = "Job", spec = { template = template("j") } }
    same(k8s.pod_spec(job), job.spec.template.spec, "pod_spec(Job without apiVersion)")
    local pod = json { kind = "Pod", spec = { containers = { gpu_container("c") } } }
    same(k8s.pod_spec(pod), pod.spec, "pod_spec(Pod without apiVersion)")
end

T["pod_spec is nil for other kinds and malformed objects"] = function()
    local cases = {
        ["ConfigMap"] = json { apiVersion = "v1", kind = "ConfigMap", data = { a = "b" } },
        ["PyTorchJob"] = json { apiVersion = "kubeflow.org/v1", kind = "PyTorchJob",
                                spec = { pytorchReplicaSpecs = { Worker = { template = template("w") } } } },
        ["Volcano Job"] = json { apiVersion = "batch.volcano.sh/v1alpha1", kind = "Job",
                                 spec = { template = template("v") } },
        ["apps/v1 Job"] = json { apiVersion = "apps/v1", kind = "Job", spec = { template = template("v") } },
        ["Deployment without template"] = json { apiVersion = "apps/v1", kind = "Deployment",
                                                 spec = { replicas = 1 } },
        ["Deployment with null template"] = json { apiVersion = "apps/v1", kind = "Deployment",
                                                   spec = { template = gg.null } },
        ["Pod with null spec"] = json { apiVersion = "v1", kind = "Pod", spec = gg.null },
        ["no kind"] = json { apiVersion = "v1", spec = { containers = { gpu_container("c") } } },
    }
    for name, obj in pairs(cases) do
        eq(k8s.pod_spec(obj), nil, "pod_spec of " .. name)
        eq(k8s.pod_meta(obj), nil, "pod_meta of " .. name)
    end
    eq(k8s.pod_spec(nil), nil, "pod_spec(nil)")
    eq(k8s.pod_spec(gg.null), nil, "pod_spec(null)")
    eq(k8s.pod_spec("Pod"), nil, "pod_spec('Pod')")
end

T["pod_meta of a Pod and of a Deployment"] = function()
    local pod = gpu_pod()
    same(k8s.pod_meta(pod), pod.metadata, "pod_meta(pod)")
    local d = deployment()
    same(k8s.pod_meta(d), d.spec.template.metadata, "pod_meta(deployment) is the template's")
end

T["pod_meta creates nothing"] = function()
    local d = json { apiVersion = "apps/v1", kind = "Deployment", metadata = { name = "d" },
                     spec = { template = { spec = { containers = { gpu_container("c") } } } } }
    local before = copy(d)
    eq(k8s.pod_meta(d), nil, "pod_meta without template metadata")
    eq(d, before, "deployment after pod_meta")
end

-- pod_templates -------------------------------------------------------------------------------

T["pod_templates of a Pod"] = function()
    local pod = gpu_pod()
    local ts = k8s.pod_templates(pod)
    eq(#ts, 1, "number of templates")
    same(ts[1].template, pod, "template")
    same(ts[1].spec, pod.spec, "spec")
    same(ts[1].meta, pod.metadata, "meta")
    eq(ts[1].path, "spec", "path")
end

T["pod_templates of a Deployment and a CronJob"] = function()
    local d = deployment()
    local ts = k8s.pod_templates(d)
    eq(paths(ts), { "spec.template.spec" }, "deployment paths")
    same(ts[1].template, d.spec.template, "template")
    same(ts[1].meta, d.spec.template.metadata, "meta")
    local cj = json { apiVersion = "batch/v1", kind = "CronJob",
                      spec = { jobTemplate = { spec = { template = template("e") } } } }
    eq(paths(k8s.pod_templates(cj)), { "spec.jobTemplate.spec.template.spec" }, "cronjob paths")
end

T["pod_templates of a PyTorchJob"] = function()
    local job = json {
        apiVersion = "kubeflow.org/v1", kind = "PyTorchJob", metadata = { name = "llama-ft" },
        spec = {
            pytorchReplicaSpecs = {
                Worker = { replicas = 3, restartPolicy = "OnFailure", template = template("worker", "8") },
                Master = { replicas = 1, restartPolicy = "OnFailure", template = template("master", "8") },
            },
            runPolicy = { cleanPodPolicy = "None" },
        },
    }
    local ts = k8s.pod_templates(job)
    eq(paths(ts), { "spec.pytorchReplicaSpecs.Master.template.spec",
                    "spec.pytorchReplicaSpecs.Worker.template.spec" }, "paths")
    same(ts[1].spec, job.spec.pytorchReplicaSpecs.Master.template.spec, "Master spec")
    same(ts[2].meta, job.spec.pytorchReplicaSpecs.Worker.template.metadata, "Worker meta")
end

T["pod_templates of a TFJob and an MPIJob"] = function()
    local tf = json { apiVersion = "kubeflow.org/v1", kind = "TFJob",
                      spec = { tfReplicaSpecs = { PS = { template = template("ps", "0") },
                                                  Chief = { template = template("chief") },
                                                  Worker = { template = template("worker") } } } }
    eq(paths(k8s.pod_templates(tf)), { "spec.tfReplicaSpecs.Chief.template.spec",
                                       "spec.tfReplicaSpecs.PS.template.spec",
                                       "spec.tfReplicaSpecs.Worker.template.spec" }, "TFJob")
    local mpi = json { apiVersion = "kubeflow.org/v2beta1", kind = "MPIJob",
                       spec = { slotsPerWorker = 8,
                                mpiReplicaSpecs = { Launcher = { template = template("launcher", "0") },
                                                    Worker = { template = template("worker", "8") } } } }
    eq(paths(k8s.pod_templates(mpi)), { "spec.mpiReplicaSpecs.Launcher.template.spec",
                                        "spec.mpiReplicaSpecs.Worker.template.spec" }, "MPIJob")
end

T["pod_templates of a RayCluster"] = function()
    local rc = json {
        apiVersion = "ray.io/v1", kind = "RayCluster", metadata = { name = "raycluster-gpu" },
        spec = {
            rayVersion = "2.9.0",
            headGroupSpec = { rayStartParams = { ["dashboard-host"] = "0.0.0.0" },
                              template = template("ray-head", "0") },
            workerGroupSpecs = {
                { groupName = "a100", replicas = 2, rayStartParams = gg.object(), template = template("a100", "1") },
                { groupName = "t4", replicas = 4, rayStartParams = gg.object(), template = template("t4", "1") },
            },
        },
    }
    local ts = k8s.pod_templates(rc)
    eq(paths(ts), { "spec.headGroupSpec.template.spec", "spec.workerGroupSpecs[0].template.spec",
                    "spec.workerGroupSpecs[1].template.spec" }, "paths")
    same(ts[3].spec, rc.spec.workerGroupSpecs[2].template.spec, "second worker group spec")
end

T["pod_templates of a RayJob and a RayService"] = function()
    local rj = json {
        apiVersion = "ray.io/v1", kind = "RayJob",
        spec = { entrypoint = "python train.py",
                 rayClusterSpec = { headGroupSpec = { template = template("head", "0") },
                                    workerGroupSpecs = { { groupName = "gpu", template = template("gpu") } } },
                 submitterPodTemplate = template("submitter", "0") },
    }
    eq(paths(k8s.pod_templates(rj)), {
        "spec.rayClusterSpec.headGroupSpec.template.spec",
        "spec.rayClusterSpec.workerGroupSpecs[0].template.spec",
        "spec.submitterPodTemplate.spec" }, "RayJob")
    local rs = json {
        apiVersion = "ray.io/v1", kind = "RayService",
        spec = { serveConfigV2 = "applications: []",
                 rayClusterConfig = { headGroupSpec = { template = template("head", "0") },
                                      workerGroupSpecs = { { groupName = "gpu", template = template("gpu") } } } },
    }
    eq(paths(k8s.pod_templates(rs)), {
        "spec.rayClusterConfig.headGroupSpec.template.spec",
        "spec.rayClusterConfig.workerGroupSpecs[0].template.spec" }, "RayService")
end

T["pod_templates of a JobSet"] = function()
    local js = json {
        apiVersion = "jobset.x-k8s.io/v1alpha2", kind = "JobSet", metadata = { name = "tpu-train" },
        spec = { replicatedJobs = {
            { name = "driver", replicas = 1, template = { spec = { template = template("driver", "0") } } },
            { name = "workers", replicas = 4,
              template = { spec = { parallelism = 2, completions = 2, template = template("worker", "8") } } },
        } },
    }
    local ts = k8s.pod_templates(js)
    eq(paths(ts), { "spec.replicatedJobs[0].template.spec.template.spec",
                    "spec.replicatedJobs[1].template.spec.template.spec" }, "paths")
    same(ts[2].template, js.spec.replicatedJobs[2].template.spec.template, "workers template")
end

T["pod_templates of a LeaderWorkerSet"] = function()
    local lws = json {
        apiVersion = "leaderworkerset.x-k8s.io/v1", kind = "LeaderWorkerSet",
        spec = { replicas = 2, leaderWorkerTemplate = {
            size = 4, leaderTemplate = template("leader"), workerTemplate = template("worker") } },
    }
    eq(paths(k8s.pod_templates(lws)), { "spec.leaderWorkerTemplate.leaderTemplate.spec",
                                        "spec.leaderWorkerTemplate.workerTemplate.spec" }, "with leader")
    local only_workers = json {
        apiVersion = "leaderworkerset.x-k8s.io/v1", kind = "LeaderWorkerSet",
        spec = { leaderWorkerTemplate = { size = 2, workerTemplate = template("worker") } },
    }
    eq(paths(k8s.pod_templates(only_workers)), { "spec.leaderWorkerTemplate.workerTemplate.spec" },
       "without leaderTemplate")
end

T["pod_templates of a Volcano Job"] = function()
    local vj = json {
        apiVersion = "batch.volcano.sh/v1alpha1", kind = "Job",
        spec = { schedulerName = "volcano", minAvailable = 2,
                 tasks = { { name = "ps", replicas = 1, template = template("ps", "0") },
                           { name = "worker", replicas = 2, template = template("worker") } } },
    }
    eq(paths(k8s.pod_templates(vj)), { "spec.tasks[0].template.spec", "spec.tasks[1].template.spec" },
       "paths")
end

T["pod_templates tolerates missing and null parts"] = function()
    eq(k8s.pod_templates(json { apiVersion = "v1", kind = "ConfigMap", data = { a = "b" } }), {},
       "ConfigMap")
    eq(k8s.pod_templates(nil), {}, "nil")
    local rc = json { apiVersion = "ray.io/v1", kind = "RayCluster",
                      spec = { headGroupSpec = { template = template("head", "0") },
                               workerGroupSpecs = gg.null } }
    eq(paths(k8s.pod_templates(rc)), { "spec.headGroupSpec.template.spec" }, "null workerGroupSpecs")
    local js = json { apiVersion = "jobset.x-k8s.io/v1alpha2", kind = "JobSet",
                      spec = { replicatedJobs = { { name = "broken", template = gg.object() } } } }
    eq(k8s.pod_templates(js), {}, "JobSet with an empty job template")
    local pt = json { apiVersion = "kubeflow.org/v1", kind = "PyTorchJob", spec = gg.null }
    eq(k8s.pod_templates(pt), {}, "PyTorchJob with null spec")
    local nometa = json { apiVersion = "apps/v1", kind = "Deployment",
                          spec = { template = { spec = { containers = { gpu_container("c") } } } } }
    local ts = k8s.pod_templates(nometa)
    eq(ts[1].meta, nil, "meta of a template without metadata")
end

-- owner_kind ----------------------------------------------------------------------------------

T["owner_kind is the controller's kind"] = function()
    local pod = gpu_pod()
    pod.metadata.ownerReferences = json {
        { apiVersion = "v1", kind = "ConfigMap", name = "not-a-controller", uid = "1" },
        { apiVersion = "apps/v1", kind = "ReplicaSet", name = "llm-7d9f", uid = "2",
          controller = true, blockOwnerDeletion = true },
    }
    local kind, ref = k8s.owner_kind(pod)
    eq(kind, "ReplicaSet", "kind")
    eq(ref.name, "llm-7d9f", "ownerReference name")
    pod.metadata.ownerReferences[2].controller = false
    eq(k8s.owner_kind(pod), nil, "no controller reference")
    pod.metadata.ownerReferences = gg.null
    eq(k8s.owner_kind(pod), nil, "null ownerReferences")
    eq(k8s.owner_kind(json { kind = "Pod", spec = gg.object() }), nil, "no metadata")
    local job_pod = json { kind = "Pod", metadata = { ownerReferences = {
        { apiVersion = "batch/v1", kind = "Job", name = "train", uid = "3", controller = true } } } }
    eq(k8s.owner_kind(job_pod), "Job", "pod of a Job")
end

-- Containers ----------------------------------------------------------------------------------

local function full_spec()
    return json {
        initContainers = {
            { name = "fetch-weights", image = "busybox" },
            { name = "log-shipper", image = "fluent-bit", restartPolicy = "Always" },
        },
        containers = { gpu_container("trainer", "2"), { name = "metrics", image = "dcgm-exporter" } },
        ephemeralContainers = { { name = "debugger", image = "busybox" } },
    }
end

T["containers yields init, regular and ephemeral in order"] = function()
    local got = {}
    for c, kind, i in k8s.containers(full_spec()) do
        got[#got + 1] = c.name .. ":" .. kind .. ":" .. i
    end
    eq(got, { "fetch-weights:init:1", "log-shipper:init:2", "trainer:regular:1",
              "metrics:regular:2", "debugger:ephemeral:1" }, "containers")
end

T["containers picks kinds with opts"] = function()
    local spec = full_spec()
    local function names(opts)
        local out = {}
        for c in k8s.containers(spec, opts) do
            out[#out + 1] = c.name
        end
        return out
    end
    eq(names({ regular = true }), { "trainer", "metrics" }, "regular")
    eq(names({ init = true, ephemeral = true }), { "fetch-weights", "log-shipper", "debugger" },
       "init and ephemeral")
    eq(names({ init = true, regular = false }), { "fetch-weights", "log-shipper" }, "regular=false")
    eq(names({}), {}, "empty opts")
    eq(names(readonly({ regular = true })), { "trainer", "metrics" }, "read-only opts")
    raises(function() k8s.containers(spec, { regulars = true }) end,
           { "k8s.containers", '"regulars"' }, "unknown option")
    raises(function() k8s.containers(spec, "regular") end, "k8s.containers: opts", "string opts")
end

T["containers skips null and missing lists"] = function()
    local spec = json { initContainers = gg.null, containers = { gpu_container("a"), gg.null,
                                                                 gpu_container("b") } }
    local got = {}
    for c, kind, i in k8s.containers(spec) do
        got[#got + 1] = c.name .. ":" .. kind .. ":" .. i
    end
    eq(got, { "a:regular:1", "b:regular:3" }, "containers")
    for _ in k8s.containers(nil) do
        error("containers(nil) yielded something")
    end
end

T["all_containers, container and is_sidecar"] = function()
    local spec = full_spec()
    eq(#k8s.all_containers(spec), 5, "all containers")
    eq(#k8s.all_containers(spec, { init = true }), 2, "init containers")
    local c, kind, i = k8s.container(spec, "log-shipper")
    eq({ c.name, kind, i }, { "log-shipper", "init", 2 }, "container log-shipper")
    eq(k8s.container(spec, "nope"), nil, "missing container")
    eq(k8s.is_sidecar(spec.initContainers[2]), true, "log-shipper is a sidecar")
    eq(k8s.is_sidecar(spec.initContainers[1]), false, "fetch-weights is not")
    eq(k8s.is_sidecar(spec.initContainers[2], "regular"), false, "restartPolicy outside init")
    eq(k8s.is_sidecar(spec.containers[1], "regular"), false, "regular container")
    local kinds = {}
    for ctr, kd in k8s.containers(spec, { init = true }) do
        kinds[#kinds + 1] = k8s.is_sidecar(ctr, kd)
    end
    eq(kinds, { false, true }, "is_sidecar over init containers")
end

T["container_path gives 0-based field paths"] = function()
    local d = deployment()
    local t = k8s.pod_templates(d)[1]
    local got = {}
    for _, kind, i in k8s.containers(full_spec()) do
        got[#got + 1] = k8s.container_path(t.path, kind, i)
    end
    eq(got, { "spec.template.spec.initContainers[0]", "spec.template.spec.initContainers[1]",
              "spec.template.spec.containers[0]", "spec.template.spec.containers[1]",
              "spec.template.spec.ephemeralContainers[0]" }, "paths")
    raises(function() k8s.container_path("spec", "sidecar", 1) end,
           { "k8s.container_path", '"sidecar"' }, "bad kind")
end

-- Resources -----------------------------------------------------------------------------------

T["get_resource reads strings and numbers"] = function()
    local c = json { name = "c", resources = { limits = { [GPU] = 2, cpu = "500m", memory = "18Gi" },
                                              requests = { cpu = 0.5 } } }
    eq(k8s.get_resource(c, "limits", GPU), "2", "integer from YAML")
    eq(k8s.get_resource(c, "limits", "memory"), "18Gi", "string")
    eq(k8s.get_resource(c, "requests", "cpu"), "0.5", "float from YAML")
    eq(k8s.get_resource(c, "requests", GPU), nil, "missing")
    eq(k8s.get_resource(json { name = "x", resources = gg.null }, "limits", GPU), nil, "null resources")
    eq(k8s.get_resource(json { name = "x", resources = { limits = gg.null } }, "limits", GPU), nil,
       "null limits")
    eq(k8s.get_resource(json { name = "x", resources = gg.object() }, "limits", GPU), nil, "{}")
    eq(k8s.get_resource(nil, "limits", GPU), nil, "nil container")
    raises(function() k8s.get_resource(c, "limit", GPU) end,
           { "k8s.get_resource", '"requests" or "limits"', '"limit"' }, "bad section")
    local bad = json { name = "odd", resources = { limits = { [GPU] = { "1" } } } }
    raises(function() k8s.get_resource(bad, "limits", GPU) end,
           { 'container "odd"', 'resources.limits["nvidia.com/gpu"]', "an array" }, "array value")
end

T["resource_milli and request_milli"] = function()
    local c = json { name = "server", resources = {
        limits = { [GPU] = "1", memory = "18Gi" }, requests = { cpu = "1500m", memory = "16Gi" } } }
    eq(k8s.resource_milli(c, "limits", GPU), 1000, "1 GPU")
    eq(k8s.resource_milli(c, "limits", "memory"), 19327352832000, "18Gi")
    eq(k8s.resource_milli(c, "requests", "cpu"), 1500, "1500m")
    eq(k8s.resource_milli(c, "requests", GPU), nil, "no GPU request")
    eq(k8s.request_milli(c, GPU), 1000, "GPU request defaults to the limit")
    eq(k8s.request_milli(c, "memory"), 17179869184000, "memory request wins over limit")
    eq(k8s.request_milli(c, "nvidia.com/mig-1g.10gb"), nil, "unused resource")
end

T["resource_milli names the container and field of a bad quantity"] = function()
    local c = json { name = "trainer", resources = { limits = { [GPU] = "one" } } }
    raises(function() k8s.resource_milli(c, "limits", GPU) end,
           { "k8s.resource_milli", 'container "trainer"', 'resources.limits["nvidia.com/gpu"]', '"one"' },
           "bad quantity")
    raises(function() k8s.request_milli(c, GPU) end, { "k8s.request_milli", 'container "trainer"' },
           "request_milli")
end

T["pod_request_milli sums containers, init containers and sidecars"] = function()
    local spec = json {
        initContainers = {
            { name = "log", restartPolicy = "Always", resources = { requests = { cpu = "100m" } } },
            { name = "migrate", resources = { requests = { cpu = "2" } } },
        },
        containers = {
            { name = "app", resources = { requests = { cpu = "500m" }, limits = { [GPU] = "1" } } },
            { name = "sidecar-gpu", resources = { limits = { [GPU] = "1" } } },
        },
        ephemeralContainers = { { name = "debug", resources = { requests = { cpu = "8" } } } },
    }
    eq(k8s.pod_request_milli(spec, GPU), 2000, "GPUs: sum of regular containers")
    eq(k8s.pod_request_milli(spec, "cpu"), 2100, "cpu: init container plus the sidecar before it")
    spec.initContainers[2].resources.requests.cpu = "200m"
    eq(k8s.pod_request_milli(spec, "cpu"), 600, "cpu: regular containers plus sidecar")
    spec.overhead = json { cpu = "250m" }
    eq(k8s.pod_request_milli(spec, "cpu"), 850, "with overhead")
    eq(k8s.pod_request_milli(spec, "memory"), 0, "unused resource")
    local init_gpu = json { initContainers = { { name = "warmup", resources = { limits = { [GPU] = "4" } } } },
                            containers = { gpu_container("main", "2") } }
    eq(k8s.pod_request_milli(init_gpu, GPU), 4000, "largest init container wins")
    eq(k8s.pod_request_milli(nil, GPU), 0, "nil spec")
end

T["set_resource creates resources and the section as objects"] = function()
    local c = json { name = "trainer", image = "pytorch" }
    eq(k8s.set_resource(c, "limits", "nvidia.com/mig-1g.10gb", "1"), true, "changed")
    eq(c, { name = "trainer", image = "pytorch",
            resources = gg.object({ limits = gg.object({ ["nvidia.com/mig-1g.10gb"] = "1" }) }) },
       "container")
    all_marked(c, "container")
    local n = json { name = "n", resources = gg.null }
    k8s.set_resource(n, "requests", GPU, 2)
    eq(n.resources, gg.object({ requests = gg.object({ [GPU] = "2" }) }), "null resources, integer value")
end

-- Calling fn(...) again leaves t as it was: it returns false and changes nothing.
local function again_unchanged(t, fn, ...)
    local once = copy(t)
    eq(fn(...), false, "second call")
    eq(t, once, "twice equals once")
end

T["set_resource twice equals once"] = function()
    local pod = gpu_pod()
    local c = pod.spec.containers[1]
    eq(k8s.set_resource(c, "requests", GPU, "1"), true, "first call")
    again_unchanged(pod, k8s.set_resource, c, "requests", GPU, "1")
    eq(k8s.set_resource(c, "limits", "memory", "32768Mi"), false, "32768Mi is 32Gi")
    eq(c.resources.limits.memory, "32Gi", "memory untouched")
    c.resources.limits.cpu = "1000m"
    eq(k8s.set_resource(c, "limits", "cpu", "1"), false, "1 is 1000m")
    eq(c.resources.limits.cpu, "1000m", "spelling kept")
    eq(k8s.set_resource(c, "limits", GPU, "2"), true, "a different value")
    eq(c.resources.limits[GPU], "2", "new value")
end

T["set_resource rejects bad arguments"] = function()
    local c = json { name = "trainer" }
    raises(function() k8s.set_resource(c, "limits", GPU, "lots") end,
           { "k8s.set_resource", 'container "trainer"', '"lots"', "not a quantity" }, "bad quantity")
    raises(function() k8s.set_resource(c, "limits", GPU, 0.5) end,
           { 'container "trainer"', "quantity string" }, "float")
    raises(function() k8s.set_resource(c, "limits", GPU, nil) end, "quantity string", "nil value")
    raises(function() k8s.set_resource(c, "request", GPU, "1") end, '"requests" or "limits"', "section")
    raises(function() k8s.set_resource(c, "limits", "", "1") end, "resource name", "empty name")
    raises(function() k8s.set_resource(nil, "limits", GPU, "1") end, "container must be a table", "nil")
    eq(c, { name = "trainer" }, "untouched after errors")
    local arr = json { name = "weird", resources = gg.array() }
    raises(function() k8s.set_resource(arr, "limits", GPU, "1") end,
           { 'container "weird"', "resources is an array" }, "resources is an array")
end

T["remove_resource removes the key and parents it empties"] = function()
    local c = json { name = "c", resources = { limits = { [GPU] = "1", memory = "8Gi" },
                                              requests = { [GPU] = "1" } } }
    eq(k8s.remove_resource(c, "requests", GPU), "1", "removed value")
    eq(c.resources, { limits = { [GPU] = "1", memory = "8Gi" } }, "requests removed when emptied")
    eq(k8s.remove_resource(c, "limits", GPU), "1", "removed limit")
    eq(c.resources, { limits = { memory = "8Gi" } }, "other limits kept")
    eq(k8s.remove_resource(c, "limits", GPU), nil, "already gone")
    eq(k8s.remove_resource(c, "limits", "memory"), "8Gi", "last one")
    eq(c, { name = "c" }, "resources removed when emptied")
    eq(k8s.remove_resource(json { name = "x", resources = gg.null }, "limits", GPU), nil, "null")
    -- set then remove on a container without resources leaves it as it was
    local plain = json { name = "p", image = "busybox" }
    k8s.set_resource(plain, "limits", GPU, "1")
    k8s.remove_resource(plain, "limits", GPU)
    eq(plain, { name = "p", image = "busybox" }, "set then remove")
    -- an existing empty resources object is left alone
    local empty = json { name = "e", resources = gg.object() }
    eq(k8s.remove_resource(empty, "limits", GPU), nil, "nothing to remove")
    eq(empty.resources, gg.object(), "resources {} kept")
end

-- Labels and annotations ----------------------------------------------------------------------

T["label and annotation read objects and metadata"] = function()
    local pod = gpu_pod()
    eq(k8s.label(pod, "app"), "llm", "label of a pod")
    eq(k8s.label(pod.metadata, "app"), "llm", "label of metadata")
    eq(k8s.label(pod, "missing"), nil, "missing label")
    eq(k8s.annotation(pod, "gpuguard.io/gpu-memory"), "18Gi", "annotation")
    eq(k8s.annotation(pod.metadata, "gpuguard.io/gpu-memory"), "18Gi", "annotation of metadata")
    eq(k8s.label(deployment(), "tier"), "serving", "a deployment's own label")
    eq(k8s.label(deployment(), "app"), nil, "not the template's label")
    eq(k8s.label(json { kind = "Pod", metadata = { labels = gg.null } }, "app"), nil, "null labels")
    eq(k8s.label(json { kind = "Pod", metadata = { labels = { app = gg.null } } }, "app"), nil, "null label")
    eq(k8s.label(json { kind = "Pod", metadata = { labels = "x" } }, "app"), nil, "labels not a map")
    eq(k8s.label(json { kind = "Pod", spec = gg.object() }, "app"), nil, "no metadata")
    eq(k8s.label(nil, "app"), nil, "nil")
end

T["annotations: the map annotation reads, of an object or of metadata"] = function()
    local pod = gpu_pod()
    eq(rawequal(k8s.annotations(pod), pod.metadata.annotations), true, "a pod's own map")
    eq(rawequal(k8s.annotations(pod.metadata), pod.metadata.annotations), true, "of metadata")
    eq(k8s.annotations(deployment()), nil, "a deployment's own: it has none")
    eq(k8s.annotations(json { kind = "Pod", metadata = { annotations = gg.null } }), nil, "null")
    eq(k8s.annotations(json { kind = "Pod", metadata = { annotations = "x" } }), nil, "not a map")
    eq(k8s.annotations(json { kind = "Pod", spec = gg.object() }), nil, "no metadata")
    eq(k8s.annotations(nil), nil, "nil")
end

T["set_label creates metadata and labels as objects"] = function()
    local pod = json { apiVersion = "v1", kind = "Pod", spec = { containers = { gpu_container("c") } } }
    eq(k8s.set_label(pod, "gpuguard.io/workload-class", "training"), true, "changed")
    eq(pod.metadata, gg.object({ labels = gg.object({ ["gpuguard.io/workload-class"] = "training" }) }),
       "metadata")
    all_marked(pod, "pod")
    local meta = json { name = "m", labels = gg.null }
    k8s.set_label(meta, "team", "vision")
    eq(meta, { name = "m", labels = gg.object({ team = "vision" }) }, "metadata with null labels")
end

T["set_label twice equals once"] = function()
    local pod = gpu_pod()
    eq(k8s.set_label(pod, "gpuguard.io/pool", "a100-mig"), true, "first")
    again_unchanged(pod, k8s.set_label, pod, "gpuguard.io/pool", "a100-mig")
    eq(k8s.set_label(pod, "app", "llm"), false, "existing label with the same value")
end

T["set_label on a template labels the pods, not the controller"] = function()
    local d = deployment()
    local t = k8s.pod_templates(d)[1]
    k8s.set_label(t.template, "gpuguard.io/managed", "true")
    eq(d.spec.template.metadata.labels["gpuguard.io/managed"], "true", "template label")
    eq(d.metadata.labels["gpuguard.io/managed"], nil, "deployment label")
    local bare = json { apiVersion = "apps/v1", kind = "Deployment",
                        spec = { template = { spec = { containers = { gpu_container("c") } } } } }
    local bt = k8s.pod_templates(bare)[1]
    k8s.set_label(bt.template, "team", "nlp")
    eq(bare.spec.template.metadata, gg.object({ labels = gg.object({ team = "nlp" }) }),
       "template metadata created")
end

T["set_label checks the value"] = function()
    local pod = gpu_pod()
    for _, v in ipairs({ "has space", "-leading", "trailing.", string.rep("a", 64), "a/b" }) do
        raises(function() k8s.set_label(pod, "k", v) end, { "k8s.set_label", "not a valid label value" },
               "label value " .. v)
    end
    for _, v in ipairs({ "", "a", "A100-SXM4-80GB", "1g.10gb", "x_y", string.rep("a", 63) }) do
        k8s.set_label(pod, "k", v)
        eq(k8s.label(pod, "k"), v, "valid label value " .. v)
    end
    raises(function() k8s.set_label(pod, "k", 1) end, { "k8s.set_label", "must be a string" }, "number")
    raises(function() k8s.set_label(pod, "", "v") end, "key must be a non-empty string", "empty key")
    raises(function() k8s.set_label(nil, "k", "v") end, "must be a table", "nil object")
end

T["remove_label"] = function()
    local pod = gpu_pod()
    eq(k8s.remove_label(pod, "app"), "llm", "removed")
    eq(k8s.label(pod, "app"), nil, "gone")
    eq(k8s.remove_label(pod, "app"), nil, "again")
    k8s.remove_label(pod, "gpuguard.io/workload-class")
    eq(pod.metadata.labels, nil, "emptied labels removed")
    eq(k8s.remove_label(json { kind = "Pod" }, "app"), nil, "no metadata")
end

T["annotations: set, twice equals once, remove"] = function()
    local pod = gpu_pod()
    eq(k8s.set_annotation(pod, "gpuguard.io/decision", "mig 1g.10gb: 18Gi asked"), true, "set")
    again_unchanged(pod, k8s.set_annotation, pod, "gpuguard.io/decision", "mig 1g.10gb: 18Gi asked")
    eq(k8s.annotation(pod, "gpuguard.io/decision"), "mig 1g.10gb: 18Gi asked", "read back")
    eq(k8s.remove_annotation(pod, "gpuguard.io/decision"), "mig 1g.10gb: 18Gi asked", "removed")
    eq(k8s.remove_annotation(pod, "gpuguard.io/decision"), nil, "removed twice")
    eq(k8s.remove_annotation(pod, "gpuguard.io/gpu-memory"), "18Gi", "last one")
    eq(pod.metadata.annotations, nil, "emptied annotations removed")
    local bare = json { apiVersion = "v1", kind = "Pod", metadata = { name = "p", annotations = gg.null } }
    k8s.set_annotation(bare, "a", "")
    eq(bare.metadata.annotations, gg.object({ a = "" }), "null annotations replaced")
    raises(function() k8s.set_annotation(bare, "a", true) end,
           { "k8s.set_annotation", 'annotation "a"', "must be a string" }, "boolean value")
end

-- Tolerations ---------------------------------------------------------------------------------

T["has_toleration matches equivalent tolerations"] = function()
    local present = { key = GPU, operator = "Equal", value = "present", effect = "NoSchedule" }
    local cases = {
        { "same toleration", { present }, present, true },
        { "Equal is the default", { { key = GPU, value = "present", effect = "NoSchedule" } }, present, true },
        { "Equal is the default (wanted)", { present }, { key = GPU, value = "present", effect = "NoSchedule" }, true },
        { "other value", { present }, { key = GPU, value = "true", effect = "NoSchedule" }, false },
        { "other key", { present }, { key = "sku", value = "present", effect = "NoSchedule" }, false },
        { "other effect", { present }, { key = GPU, value = "present", effect = "NoExecute" }, false },
        { "Exists covers any value", { GPU_TAINT }, present, true },
        { "Equal does not cover Exists", { present }, GPU_TAINT, false },
        { "Exists without key covers all", { { operator = "Exists" } }, present, true },
        { "Exists without key, one effect", { { operator = "Exists", effect = "NoExecute" } }, present, false },
        { "no effect covers all effects", { { key = GPU, operator = "Exists" } }, GPU_TAINT, true },
        { "one effect does not cover all", { GPU_TAINT }, { key = GPU, operator = "Exists" }, false },
        { "bounded does not cover forever",
          { { key = "k", operator = "Exists", effect = "NoExecute", tolerationSeconds = 300 } },
          { key = "k", operator = "Exists", effect = "NoExecute" }, false },
        { "forever covers bounded", { { key = "k", operator = "Exists", effect = "NoExecute" } },
          { key = "k", operator = "Exists", effect = "NoExecute", tolerationSeconds = 300 }, true },
        { "longer covers shorter",
          { { key = "k", operator = "Exists", effect = "NoExecute", tolerationSeconds = 600 } },
          { key = "k", operator = "Exists", effect = "NoExecute", tolerationSeconds = 300 }, true },
        { "null fields are missing", { { key = GPU, operator = gg.null, value = "present", effect = "NoSchedule",
                                         tolerationSeconds = gg.null } }, present, true },
    }
    for _, case in ipairs(cases) do
        local spec = json { tolerations = case[2] }
        eq(k8s.has_toleration(spec, case[3]), case[4], case[1])
    end
    eq(k8s.has_toleration(json { tolerations = gg.null }, GPU_TAINT), false, "null tolerations")
    eq(k8s.has_toleration(json { containers = gg.array() }, GPU_TAINT), false, "no tolerations")
    eq(k8s.has_toleration(nil, GPU_TAINT), false, "nil spec")
end

T["add_toleration creates the list and twice equals once"] = function()
    local pod = json { apiVersion = "v1", kind = "Pod", spec = { containers = { gpu_container("c") } } }
    eq(k8s.add_toleration(pod.spec, GPU_TAINT), true, "added")
    eq(pod.spec.tolerations, gg.array({ gg.object({ key = GPU, operator = "Exists", effect = "NoSchedule" }) }),
       "tolerations")
    all_marked(pod, "pod")
    again_unchanged(pod, k8s.add_toleration, pod.spec, GPU_TAINT)
    local t = { key = GPU, operator = "Exists", effect = "NoSchedule" }
    eq(k8s.add_toleration(pod.spec, t), false, "an equal table")
    truthy(not rawequal(pod.spec.tolerations[1], GPU_TAINT), "a copy is added, not the argument")
end

T["add_toleration appends after existing tolerations"] = function()
    local pod = gpu_pod()
    eq(k8s.add_toleration(pod.spec, { key = "sku", value = "gpu", effect = "NoSchedule" }), true, "added")
    eq(pod.spec.tolerations, {
        { key = "node.kubernetes.io/not-ready", operator = "Exists", effect = "NoExecute", tolerationSeconds = 300 },
        { key = "sku", value = "gpu", effect = "NoSchedule" },
    }, "tolerations")
    local covered = json { tolerations = { { operator = "Exists" } } }
    eq(k8s.add_toleration(covered, GPU_TAINT), false, "covered by a toleration of everything")
    eq(#covered.tolerations, 1, "nothing added")
    local null = json { tolerations = gg.null }
    k8s.add_toleration(null, GPU_TAINT)
    eq(#null.tolerations, 1, "null tolerations replaced")
    truthy(gg.is_array(null.tolerations), "tolerations is an array")
end

T["add_toleration copies a read-only toleration from config"] = function()
    local cfg = readonly({ key = GPU, operator = "Equal", value = "present", effect = "NoSchedule",
                           tolerationSeconds = gg.null })
    local spec = json { containers = { gpu_container("c") } }
    eq(k8s.add_toleration(spec, cfg), true, "added")
    eq(spec.tolerations[1], gg.object({ key = GPU, operator = "Equal", value = "present", effect = "NoSchedule" }),
       "copy")
    eq(k8s.has_toleration(spec, cfg), true, "has it now")
    eq(k8s.add_toleration(spec, cfg), false, "again")
    local bounded = readonly({ key = "spot", operator = "Exists", effect = "NoExecute", tolerationSeconds = 120 })
    k8s.add_toleration(spec, bounded)
    eq(spec.tolerations[2].tolerationSeconds, 120, "tolerationSeconds copied")
end

T["add_toleration rejects invalid tolerations"] = function()
    local spec = json { containers = { gpu_container("c") } }
    raises(function() k8s.add_toleration(spec, { key = GPU, operator = "In" }) end,
           { "k8s.add_toleration", "operator", '"In"' }, "operator")
    raises(function() k8s.add_toleration(spec, { key = GPU, operator = "Exists", value = "x" }) end,
           "Exists takes no value", "Exists with value")
    raises(function() k8s.add_toleration(spec, { value = "x" }) end, "without a key", "no key, Equal")
    raises(function() k8s.add_toleration(spec, { key = GPU, operator = "Exists", effect = "NoSchedul" }) end,
           { "effect", '"NoSchedul"' }, "effect")
    raises(function() k8s.add_toleration(spec, { key = GPU, operator = "Exists", tolerationSeconds = "300" }) end,
           "tolerationSeconds must be an integer", "seconds")
    raises(function() k8s.add_toleration(spec, nil) end, "toleration must be a table", "nil toleration")
    raises(function() k8s.add_toleration(nil, GPU_TAINT) end, "spec must be a table", "nil spec")
    raises(function() k8s.has_toleration(spec, "nvidia.com/gpu") end, "k8s.has_toleration", "string toleration")
    eq(spec.tolerations, nil, "nothing added")
end

-- Node selectors ------------------------------------------------------------------------------

T["node selectors: set, twice equals once, remove"] = function()
    local spec = json { containers = { gpu_container("c") } }
    eq(k8s.node_selector(spec, "nvidia.com/gpu.product"), nil, "absent")
    eq(k8s.set_node_selector(spec, "nvidia.com/gpu.product", "NVIDIA-A100-SXM4-80GB"), true, "set")
    eq(spec.nodeSelector, gg.object({ ["nvidia.com/gpu.product"] = "NVIDIA-A100-SXM4-80GB" }), "nodeSelector")
    again_unchanged(spec, k8s.set_node_selector, spec, "nvidia.com/gpu.product", "NVIDIA-A100-SXM4-80GB")
    eq(k8s.node_selector(spec, "nvidia.com/gpu.product"), "NVIDIA-A100-SXM4-80GB", "read back")
    k8s.set_node_selector(spec, "nvidia.com/mig.strategy", "mixed")
    eq(k8s.remove_node_selector(spec, "nvidia.com/gpu.product"), "NVIDIA-A100-SXM4-80GB", "removed")
    eq(spec.nodeSelector, { ["nvidia.com/mig.strategy"] = "mixed" }, "other selector kept")
    k8s.remove_node_selector(spec, "nvidia.com/mig.strategy")
    eq(spec.nodeSelector, nil, "emptied nodeSelector removed")
    local null = json { nodeSelector = gg.null }
    k8s.set_node_selector(null, "pool", "h100")
    eq(null.nodeSelector, gg.object({ pool = "h100" }), "null nodeSelector replaced")
    raises(function() k8s.set_node_selector(spec, "pool", 1) end,
           { "k8s.set_node_selector", '"pool"', "must be a string" }, "number value")
    eq(k8s.node_selector(nil, "pool"), nil, "nil spec")
end

-- Environment ---------------------------------------------------------------------------------

T["set_env appends, replaces, and twice equals once"] = function()
    local c = json { name = "trainer", image = "pytorch" }
    eq(k8s.set_env(c, "NVIDIA_VISIBLE_DEVICES", "all"), true, "appended")
    eq(c.env, gg.array({ gg.object({ name = "NVIDIA_VISIBLE_DEVICES", value = "all" }) }), "env")
    all_marked(c, "container")
    again_unchanged(c, k8s.set_env, c, "NVIDIA_VISIBLE_DEVICES", "all")
    eq(k8s.set_env(c, "NVIDIA_VISIBLE_DEVICES", "none"), true, "replaced")
    eq(c.env, { { name = "NVIDIA_VISIBLE_DEVICES", value = "none" } }, "replaced in place")
    k8s.set_env(c, "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", "50")
    eq(#c.env, 2, "second variable appended")
    eq(c.env[2].name, "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", "order kept")
end

T["set_env replaces valueFrom and duplicates"] = function()
    local c = json { name = "worker", env = {
        { name = "GPU_PORTION", valueFrom = { configMapKeyRef = { name = "shared-gpu", key = "portion" } } },
        { name = "OTHER", value = "x" },
        { name = "GPU_PORTION", value = "0.5" },
    } }
    eq(k8s.set_env(c, "GPU_PORTION", "0.25"), true, "changed")
    eq(c.env, { { name = "GPU_PORTION", value = "0.25" }, { name = "OTHER", value = "x" },
                { name = "GPU_PORTION", value = "0.25" } }, "env")
    again_unchanged(c, k8s.set_env, c, "GPU_PORTION", "0.25")
    local null = json { name = "n", env = gg.null }
    k8s.set_env(null, "A", "1")
    truthy(gg.is_array(null.env), "null env replaced by an array")
    raises(function() k8s.set_env(c, "N", 1) end, { "k8s.set_env", 'container "worker"', "must be a string" },
           "number value")
    raises(function() k8s.set_env(c, "", "1") end, "name must be a non-empty string", "empty name")
end

T["get_env"] = function()
    local c = json { name = "w", env = {
        { name = "A", value = "1" },
        { name = "EMPTY" },
        { name = "FROM", valueFrom = { fieldRef = { fieldPath = "metadata.name" } } },
        { name = "A", value = "2" },
    } }
    eq(k8s.get_env(c, "A"), "2", "last entry wins")
    eq(k8s.get_env(c, "EMPTY"), "", "no value is empty")
    local v, entry = k8s.get_env(c, "FROM")
    eq(v, nil, "valueFrom value")
    same(entry, c.env[3], "valueFrom entry")
    eq(k8s.get_env(c, "MISSING"), nil, "missing")
    eq(k8s.get_env(json { name = "x" }, "A"), nil, "no env")
    eq(k8s.get_env(nil, "A"), nil, "nil container")
end

-- Errors --------------------------------------------------------------------------------------

T["errors point at the calling line, not into the library"] = function()
    local c = json { name = "trainer", resources = { limits = { [GPU] = "one" } } }
    local arr_meta = json { kind = "Pod", metadata = gg.array() }
    local calls = {
        containers = function() k8s.containers(nil, { regulars = true }) end,
        all_containers = function() k8s.all_containers(nil, 1) end,
        get_resource = function() k8s.get_resource(c, "limit", GPU) end,
        resource_milli = function() k8s.resource_milli(c, "limits", GPU) end,
        request_milli = function() k8s.request_milli(c, GPU) end,
        pod_request_milli = function() k8s.pod_request_milli(json { containers = { c } }, GPU) end,
        set_resource = function() k8s.set_resource(c, "limits", GPU, "x") end,
        remove_resource = function() k8s.remove_resource(c, "limit", GPU) end,
        set_label = function() k8s.set_label(gpu_pod(), "k", 1) end,
        ["set_label (metadata is an array)"] = function() k8s.set_label(arr_meta, "k", "v") end,
        set_annotation = function() k8s.set_annotation(gpu_pod(), "", "v") end,
        has_toleration = function() k8s.has_toleration(nil, { operator = "Maybe" }) end,
        add_toleration = function() k8s.add_toleration(json { tolerations = gg.object() }, GPU_TAINT) end,
        set_node_selector = function() k8s.set_node_selector(nil, "k", "v") end,
        set_env = function() k8s.set_env(json { name = "x", env = gg.object() }, "A", "1") end,
        container_path = function() k8s.container_path("spec", nil, 1) end,
    }
    for name, fn in pairs(calls) do
        local ok, err = pcall(fn)
        truthy(not ok, name .. " raises")
        err = tostring(err)
        truthy(err:find("test_k8s", 1, true), name .. " blames the test file: " .. err)
        truthy(err:find("k8s." .. name:match("^[%w_]+"), 1, true), name .. " names itself: " .. err)
    end
end

-- Whole mutations -----------------------------------------------------------------------------

T["a GPU mutation of a Deployment is idempotent"] = function()
    local d = deployment()
    eq(gpu_mutation(d), true, "first run changes")
    all_marked(d, "deployment")
    again_unchanged(d, gpu_mutation, d)
    local spec = d.spec.template.spec
    eq(spec.tolerations, { GPU_TAINT }, "toleration")
    eq(spec.nodeSelector, { ["nvidia.com/gpu.present"] = "true" }, "node selector")
    eq(spec.containers[1].resources.requests[GPU], "1", "GPU request")
    eq(d.metadata.labels, { tier = "serving" }, "deployment labels untouched")
end

T["a GPU mutation of every template of a RayCluster"] = function()
    local rc = json {
        apiVersion = "ray.io/v1", kind = "RayCluster",
        spec = { headGroupSpec = { template = { spec = { containers = { { name = "head", image = "ray" } } } } },
                 workerGroupSpecs = { { groupName = "gpu", template = template("gpu-worker", "1") },
                                      { groupName = "cpu", template = { spec = { containers = {
                                          { name = "cpu-worker", image = "ray" } } } } } } },
    }
    gpu_mutation(rc)
    again_unchanged(rc, gpu_mutation, rc)
    eq(rc.spec.headGroupSpec.template.spec.tolerations, nil, "head has no GPU: untouched")
    eq(rc.spec.workerGroupSpecs[1].template.spec.tolerations, { GPU_TAINT }, "gpu workers")
    eq(rc.spec.workerGroupSpecs[2].template.metadata, nil, "cpu workers untouched")
    eq(k8s.label(rc.spec.workerGroupSpecs[1].template, "gpuguard.io/managed"), "true", "label")
end

T["the sample admission review pod"] = function()
    -- tests/data/reviews/pod-create.json, request.object
    local pod = json {
        apiVersion = "v1", kind = "Pod",
        metadata = { generateName = "llm-inference-", namespace = "team-a",
                     labels = { app = "llm-inference", team = "team-a", ["gpuguard.io/workload-class"] = "inference" },
                     annotations = { ["gpuguard.io/gpu-memory"] = "18Gi" } },
        spec = {
            containers = { {
                name = "server", image = "vllm/vllm-openai:v0.6.3",
                args = { "--model", "meta-llama/Llama-3.1-8B-Instruct", "--max-model-len", "8192" },
                ports = { { containerPort = 8000, protocol = "TCP" } },
                resources = { requests = { cpu = "4", memory = "24Gi" }, limits = { memory = "24Gi" } },
            } },
            restartPolicy = "Always",
            tolerations = {
                { key = "node.kubernetes.io/not-ready", operator = "Exists", effect = "NoExecute", tolerationSeconds = 300 },
                { key = "node.kubernetes.io/unreachable", operator = "Exists", effect = "NoExecute", tolerationSeconds = 300 },
            },
        },
        status = gg.object(),
    }
    local spec = k8s.pod_spec(pod)
    eq(k8s.label(pod, "gpuguard.io/workload-class"), "inference", "class")
    eq(gg.quantity(k8s.annotation(pod, "gpuguard.io/gpu-memory")), 19327352832000, "gpu-memory")
    eq(k8s.pod_request_milli(spec, GPU), 0, "no whole GPU asked")
    eq(k8s.pod_request_milli(spec, "memory"), 24 * 1024 * 1024 * 1024 * 1000, "memory")
    local before = copy(pod)
    -- What a MIG policy would do, twice.
    for _ = 1, 2 do
        local c = k8s.container(spec, "server")
        k8s.set_resource(c, "limits", "nvidia.com/mig-2g.20gb", "1")
        k8s.set_node_selector(spec, "nvidia.com/mig.strategy", "mixed")
        k8s.add_toleration(spec, { key = GPU, operator = "Exists", effect = "NoSchedule" })
        k8s.set_annotation(pod, "gpuguard.io/decision", "mig 2g.20gb for 18Gi")
    end
    all_marked(pod, "pod")
    before.spec.containers[1].resources.limits["nvidia.com/mig-2g.20gb"] = "1"
    before.spec.nodeSelector = { ["nvidia.com/mig.strategy"] = "mixed" }
    before.spec.tolerations[3] = GPU_TAINT
    before.metadata.annotations["gpuguard.io/decision"] = "mig 2g.20gb for 18Gi"
    eq(pod, before, "pod after the mutation")
end

function T.contains_finds_exact_members()
    local names = readonly({ "gpu-operator", "kube-system" })
    eq(k8s.contains(names, "kube-system"), true, "a member of a read-only list")
    eq(k8s.contains(names, "kube"), false, "a prefix is no member")
    eq(k8s.contains(nil, "kube-system"), false, "no list")
    eq(k8s.contains({ 1, 2 }, "1"), false, "1 is not \"1\"")
end

return T
