--[[
testlib.lua - assertions and fixture builders for the Lua library's tests (tests/lua/test_*.lua).

Loaded with `local t = require "testlib"` in the policy sandbox, like a library module, but from
the test module directory (lua_tests --test-lib): it is not part of lua/ and does not ship.
Every assertion raises at the test line that called it (error level 2).
]]

local gg = require "gpuguard"

local M = {}

-- Values ---------------------------------------------------------------------------------------

-- A value as text for messages: strings quoted, tables with sorted keys ([...] for an array,
-- {...} otherwise), null for gg.null, nesting cut below four levels.
function M.dump(v, depth)
    depth = depth or 0
    if v == gg.null then
        return "null"
    elseif type(v) == "string" then
        return string.format("%q", v)
    elseif type(v) ~= "table" then
        return tostring(v)
    elseif depth > 3 then
        return "{...}"
    end
    local keys = {}
    for k in pairs(v) do
        keys[#keys + 1] = k
    end
    table.sort(keys, function(a, b) return tostring(a) < tostring(b) end)
    local parts = {}
    for _, k in ipairs(keys) do
        parts[#parts + 1] = tostring(k) .. "=" .. M.dump(v[k], depth + 1)
    end
    return (gg.is_array(v) and "[" or "{") .. table.concat(parts, ", ")
        .. (gg.is_array(v) and "]" or "}")
end
local dump = M.dump

function M.mark_name(t)
    return gg.is_array(t) and "array" or gg.is_object(t) and "object" or "unmarked table"
end
local mark_name = M.mark_name

-- The first difference between got and want, or nil.  Tables compare deeply; a marked table in
-- want must be marked the same way in got.
function M.diff(got, want, path)
    if type(want) ~= "table" or type(got) ~= "table" then
        if got ~= want then
            return string.format("%s: got %s, want %s", path, dump(got), dump(want))
        end
        return nil
    end
    if (gg.is_array(want) or gg.is_object(want)) and mark_name(got) ~= mark_name(want) then
        return string.format("%s: got %s, want %s", path, mark_name(got), mark_name(want))
    end
    for k, v in pairs(want) do
        local d = M.diff(got[k], v, path .. "." .. tostring(k))
        if d then
            return d
        end
    end
    for k, v in pairs(got) do
        if want[k] == nil then
            return string.format("%s.%s: unexpected %s", path, tostring(k), dump(v))
        end
    end
    return nil
end
local diff = M.diff

-- Assertions -----------------------------------------------------------------------------------

-- got equals want; tables compare deeply (see diff).
function M.eq(got, want, what)
    local d = diff(got, want, what or "value")
    if d then
        error(d, 2)
    end
end

-- got equals want; when want is a table, got is a table holding every field of want (each
-- compared deeply) and may hold more.
function M.eq_fields(got, want, what)
    if type(want) == "table" then
        if type(got) ~= "table" then
            error(string.format("%s: got %s, want %s", what, dump(got), dump(want)), 2)
        end
        for k, v in pairs(want) do
            if got[k] ~= v and not (type(v) == "table" and diff(got[k], v, "") == nil) then
                error(string.format("%s.%s: got %s, want %s", what, tostring(k), dump(got[k]),
                                    dump(v)), 2)
            end
        end
        return
    end
    if got ~= want then
        error(string.format("%s: got %s, want %s", what, dump(got), dump(want)), 2)
    end
end

-- got is the very value want (rawequal).
function M.same(got, want, what)
    if not rawequal(got, want) then
        error(string.format("%s: got %s, want the very table %s", what, dump(got), dump(want)), 2)
    end
end

function M.truthy(v, what)
    if not v then
        error(what .. ": got " .. dump(v) .. ", want true", 2)
    end
end

-- fn must raise an error whose message contains every plain string in wants (a string or a
-- list of them); returns the message.
function M.raises(fn, wants, what)
    local ok, err = pcall(fn)
    if ok then
        error(what .. ": no error raised", 2)
    end
    err = tostring(err)
    for _, w in ipairs(type(wants) == "table" and wants or { wants }) do
        if not err:find(w, 1, true) then
            error(string.format("%s: error %q does not contain %q", what, err, w), 2)
        end
    end
    return err
end

-- fn must raise an error whose message is exactly want (error(msg, 0): no position).
function M.raises_exactly(fn, want, what)
    local ok, err = pcall(fn)
    if ok then
        error(what .. ": no error raised", 2)
    end
    if err ~= want then
        error(string.format("%s:\n  got  %s\n  want %s", what, tostring(err), want), 2)
    end
end

-- The path of the first unmarked table under v, or nil.
local function first_unmarked(v, path)
    if type(v) ~= "table" then
        return nil
    end
    if not (gg.is_array(v) or gg.is_object(v)) then
        return path
    end
    local found = nil
    for k, x in pairs(v) do
        found = found or first_unmarked(x, path .. "." .. tostring(k))
    end
    return found
end

-- Every table under v is marked (what the engine needs to encode it).
function M.all_marked(v, path)
    local p = first_unmarked(v, path)
    if p then
        error(p .. " is an unmarked table", 2)
    end
end

-- Fixtures -------------------------------------------------------------------------------------

local EMPTY = {} -- what mark_fixture gives when a table under t is empty and unmarked

-- t with every table under it marked as json says, or EMPTY.
local function mark_fixture(t)
    if type(t) ~= "table" then
        return t
    end
    for _, v in pairs(t) do
        if mark_fixture(v) == EMPTY then
            return EMPTY
        end
    end
    if gg.is_array(t) or gg.is_object(t) then
        return t
    elseif t[1] ~= nil then
        return gg.array(t)
    end
    for _ in pairs(t) do
        return gg.object(t)
    end
    return EMPTY
end

-- Mark a plain fixture table as the engine marks decoded JSON: sequences become arrays, other
-- tables objects (empty ones must be marked explicitly with gg.array() / gg.object()).
function M.json(t)
    local marked = mark_fixture(t)
    if marked == EMPTY then
        error("fixture has an empty table: mark it with gg.array() or gg.object()", 2)
    end
    return marked
end

-- A deep copy keeping the marks.
function M.copy(v)
    if type(v) ~= "table" then
        return v
    end
    local c = {}
    for k, x in pairs(v) do
        c[k] = M.copy(x)
    end
    if gg.is_array(v) then
        return gg.array(c)
    elseif gg.is_object(v) then
        return gg.object(c)
    end
    return c
end

-- A read-only proxy like the ones the engine gives for config tables, all the way down: reads
-- through it, pairs and # work and writes raise.  (Unlike the engine's, whose sandbox reads
-- through them, next and rawget see an empty table here.)
function M.readonly(t)
    if type(t) ~= "table" then
        return t
    end
    local inner = {}
    for k, v in pairs(t) do
        inner[k] = M.readonly(v)
    end
    return setmetatable({}, {
        __index = inner,
        __newindex = function() error("write into a read-only table", 2) end,
        __pairs = function() return pairs(inner) end,
        __len = function() return #inner end,
    })
end

return M
