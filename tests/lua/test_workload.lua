--[[
test_workload.lua - what workload.lua settles for a pod's request: once a policy has found the pod
asking for a GPU (workload.intent, or workload.settle_wants_gpu from 10-gpu-sharing's
pass-through), wants_gpu answers true for the rest of the request without working it out again;
another pod is asked afresh, and an answer already given stays.
]]

local gg = require "gpuguard"
local workload = require "workload"
local testlib = require "testlib"

local eq = testlib.eq

local T = {}

local CFG = gg.readonly({})

local function pod(annotations)
    return testlib.json({
        kind = "Pod", apiVersion = "v1",
        metadata = { name = "p", namespace = "team-a", annotations = annotations or gg.object() },
        spec = { containers = { { name = "c", image = "x" } } },
    })
end

function T.test_settling_says_a_pod_wants_a_gpu_unless_it_was_asked_already()
    local settled, asked = pod(), pod()
    eq(workload.compute_wants_gpu(settled, CFG, "team-a"), false, "no GPU asked")
    eq(workload.wants_gpu(asked, CFG, "team-a"), false, "asked first")
    workload.settle_wants_gpu(settled)
    workload.settle_wants_gpu(asked)
    eq(workload.wants_gpu(settled, CFG, "team-a"), true, "settled: not worked out again")
    eq(workload.wants_gpu(asked, CFG, "team-a"), false, "the first answer of the request stays")
    eq(workload.wants_gpu(pod(), CFG, "team-a"), false, "another pod: its own answer")
end

function T.test_the_intent_settles_a_pod_that_asks()
    local p = pod({ ["gpuguard.io/gpu-fraction"] = "0.5" })
    local asks = workload.intent(p)
    eq(#asks, 1, "one container asks")
    p.metadata.annotations["gpuguard.io/gpu-fraction"] = nil -- an edit after asking
    eq(workload.wants_gpu(p, CFG, "team-a"), true, "settled by the intent")
end

return T
