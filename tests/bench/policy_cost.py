"""policy_cost.py - where a review's instructions go: the engine's own floor, the
policies' own logic, and the bridge between them (callgrind on bench_engine).  A
library of tests/bench/cost.py: `make cost COST_FLAGS=--split` (cost.py --split
[--reviews NAME,...] [--phases mutate] [--work-dir DIR]) runs split().

For each review it counts instructions per review (the difference between two
-n values under callgrind, divided by theirs, --grace-us 1000000000 as in
`make bench`, address randomisation off when setarch is there) of four policy
directories made from the shipped ones:

  shipped   the policies as they are;
  floor     each policy replaced by one with its name and match whose functions
            return at once: decoding, the request's set-up, the calls, encoding;
  plain     one driver policy that copies the object into plain Lua tables and
            calls every shipped policy whose match takes the review (kinds, operations
            and namespaces; a match on labels is refused), on the copy, mutate functions then validate ones (only
            mutate ones with --phases mutate); the policies load as library modules;
  copy      the same driver, copying only.

The policies' own logic is plain - copy: their Lua with no lazy filling, no
read-only views and no diff of their edits.  What is left of shipped - floor is
the bridge: filling the object's tables on first use, the views, gpuguard.peek and
gpuguard.fields through stubs, the diff of the policies' edits.  Figures, not
pass/fail: `make cost COST_FLAGS=--split` prints them through tests/bench/cost.py (split());
tests/integration/test_bench_smoke.py runs it briefly.
"""

import re
import shutil
import sys
from pathlib import Path

from repeatable import CountError, per_review

# A shipped policy as a library module (pNN) stands in for itself in every variant.
NOOP = """local p = require "{module}"
local function plain(v) -- a module's tables are read-only views: the loader wants its own
    if type(v) ~= "table" then
        return v
    end
    local t = {{}}
    for k, x in pairs(v) do
        t[k] = plain(x)
    end
    return t
end
return {{ name = p.name, match = plain(p.match), mode = p.mode, failure = p.failure,
         mutate = p.mutate and function() end, validate = p.validate and function() end }}
"""

DRIVER = """-- Runs the shipped policies (library modules) on a plain copy of the object.
local gg = require "gpuguard"
local RUN, PHASES = {run}, "{phases}"
local P = {{ {modules} }}
local function listed(list, v)
    if list == nil then
        return true
    end
    for i = 1, #list do
        if list[i] == v then
            return true
        end
    end
    return false
end
-- Which policies take a kind, operation and namespace, as the engine's match does (without
-- kinds, Pods only), worked out once: not the policies' own work.
local matched = {{}}
local function matching(kind, operation, namespace)
    local key = kind .. " " .. operation .. " " .. namespace
    local ran = matched[key]
    if not ran then
        ran = {{}}
        for i = 1, #P do
            local m = P[i].match or {{}}
            if m.labels ~= nil then
                error("policy " .. tostring(P[i].name) .. ": match.labels is beyond this driver", 0)
            end
            local ns = m.namespaces or {{}}
            ran[i] = (m.kinds == nil and kind == "Pod" or m.kinds ~= nil and listed(m.kinds, kind))
                and listed(m.operations, operation) and listed(ns.include, namespace)
                and not (ns.exclude ~= nil and listed(ns.exclude, namespace))
        end
        matched[key] = ran
    end
    return ran
end
local function copy(v)
    if type(v) ~= "table" then
        return v
    end
    local out = gg.is_array(v) and gg.array() or gg.object()
    for k, x in pairs(v) do
        out[k] = copy(x)
    end
    return out
end
return {{
    name = "driver",
    mutate = function(req, obj, cfg)
        local plain = copy(obj)
        if not RUN then
            return
        end
        local ran = matching(req.kind, req.operation, req.namespace or "")
        for i = 1, #P do
            if ran[i] and P[i].mutate then
                P[i].mutate(req, plain, cfg)
            end
        end
        for i = 1, #P do
            if PHASES == "both" and ran[i] and P[i].validate then
                P[i].validate(req, plain, cfg)
            end
        end
    end,
}}
"""


def variants(policies, lua, work, phases):
    """The four policy directories and the library directory they share."""
    lib = work / "lua"
    for name in ("lua", "shipped", "floor", "plain", "copy"):  # a --work-dir used before
        shutil.rmtree(work / name, ignore_errors=True)
    shutil.copytree(lua, lib)
    modules = []
    for f in sorted(policies.glob("*.lua")):
        module = "policy_" + re.sub(r"[^A-Za-z0-9_]", "_", f.stem)
        shutil.copyfile(f, lib / f"{module}.lua")
        modules.append(module)
    dirs = {}
    for name in ("shipped", "floor", "plain", "copy"):
        d = work / name
        d.mkdir()
        dirs[name] = d
    for f in sorted(policies.glob("*.lua")):
        shutil.copyfile(f, dirs["shipped"] / f.name)
    for f, module in zip(sorted(policies.glob("*.lua")), modules):
        (dirs["floor"] / f.name).write_text(NOOP.format(module=module))
    listed = ", ".join(f'require "{m}"' for m in modules)
    for name, run in (("plain", "true"), ("copy", "false")):
        (dirs[name] / "00-driver.lua").write_text(
            DRIVER.format(run=run, phases=phases, modules=listed))
    return lib, dirs


def split(engine, policies, lua, phases, counts, reviews, work):
    """Prints the table: for each review, the shipped policies' instructions per review and
    their split into the floor, the policies' logic and the bridge.  reviews: (path, flags)
    pairs, flags being what the review runs against (--config, --cluster-state)."""
    work.mkdir(parents=True, exist_ok=True)
    lib, dirs = variants(policies, lua, work, phases)
    print(f"instructions per review (callgrind, -n {counts[1]} minus -n {counts[0]}, "
          f"phases {phases})")
    print("| review | shipped | floor (no-op policies) | policies' logic (plain - copy) "
          "| the bridge (the rest) |")
    print("|---|---|---|---|---|")
    for review, review_flags in reviews:
        got = {}
        for name, d in dirs.items():
            # The driver runs every phase's functions inside its mutate.
            flags = ["--policies", d, "--lua", lib, "--phases",
                     "mutate" if name in ("plain", "copy") else phases, *review_flags]
            try:
                got[name], _ = per_review(engine, flags, counts, review, work)
            except CountError as e:
                sys.exit(f"policy_cost: {e}")
        logic = got["plain"] - got["copy"]
        bridge = got["shipped"] - got["floor"] - logic
        print(f"| {Path(review).name} | {got['shipped']:,} | {got['floor']:,} | {logic:,} "
              f"| {bridge:,} |", flush=True)
