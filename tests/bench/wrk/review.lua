-- review.lua - a wrk script for tests/bench/bench_server.py: POSTs
-- AdmissionReview bodies (application/json) to the URL's path, cycling
-- through the files given after `--`, and prints one machine-readable line
-- at the end (requests, errors, latency percentiles in microseconds).
--
--   wrk -t2 -c32 -d20s -s review.lua 'https://127.0.0.1:PORT/mutate?timeout=10s' -- A.json B.json
--
-- wrk runs LuaJIT (Lua 5.1); `make lint` parses this file with luac5.4, so it
-- keeps to the syntax both accept.

local requests = {}
local next_index = 0

function init(args)
    for _, path in ipairs(args) do
        local f = assert(io.open(path, "rb"))
        local body = f:read("*a")
        f:close()
        local headers = {
            ["Content-Type"] = "application/json",
            ["Accept"] = "application/json, */*",
            ["User-Agent"] = "kube-apiserver-admission",
        }
        requests[#requests + 1] = wrk.format("POST", wrk.path, headers, body)
    end
    assert(#requests > 0, "review.lua: no body files given after --")
end

function request()
    next_index = next_index % #requests + 1
    return requests[next_index]
end

function done(summary, latency, requests_)
    local e = summary.errors
    io.write(string.format(
        "BENCH_RESULT {\"requests\":%.0f,\"duration_us\":%.0f,\"bytes\":%.0f," ..
        "\"errors\":{\"connect\":%.0f,\"read\":%.0f,\"write\":%.0f,\"status\":%.0f,\"timeout\":%.0f}," ..
        "\"latency_us\":{\"p50\":%.0f,\"p90\":%.0f,\"p99\":%.0f,\"p99.9\":%.0f," ..
        "\"max\":%.0f,\"mean\":%.1f,\"stdev\":%.1f}}\n",
        summary.requests, summary.duration, summary.bytes,
        e.connect, e.read, e.write, e.status, e.timeout,
        latency:percentile(50), latency:percentile(90), latency:percentile(99),
        latency:percentile(99.9), latency.max, latency.mean, latency.stdev))
end
