-- 10-walk-config.lua - a benchmark policy, not a guardrail: it walks the
-- shared configuration's read-only tables the plain Lua way (ipairs, #,
-- pairs, next), twenty times per review, and reads nothing of the pod.
--
-- Instructions per walk, under callgrind (the difference of two runs over
-- the number of reviews between them):
--   valgrind --tool=callgrind build/bench/bench_engine --policies tests/bench/walk-config \
--       --lua lua --config deploy/gpuguard.yaml --grace-us 1000000000 -n N \
--       tests/data/reviews/bench-pod.json
return {
    name = "walk-config",
    validate = function(req, pod, cfg)
        local n = 0
        for _ = 1, 20 do
            for _, pool in ipairs(cfg.pools) do
                n = n + #pool.name
                for _, t in ipairs(pool.taints or {}) do
                    n = n + #t.key
                end
                for k in pairs(pool) do
                    n = n + #k
                end
            end
            n = n + #cfg.pools + #cfg.guardrails.required_labels
            local k = next(cfg)
            while k ~= nil do
                k = next(cfg, k)
            end
        end
        if n < 0 then
            req:deny("unreachable")
        end
    end,
}
