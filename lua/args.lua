--[[
args.lua - how the gpuguard library modules word their errors (internal: policies do not use it).

Two kinds of error, one wording each:
  * a bad argument raises "<module>.<function>: <argument> must be <what it wants>, got <what it
    got>" at the policy line that called the library (args.failer);
  * a bad configuration value raises "<key path>: <what is wrong>" without a position
    (args.config_fail), so that the engine can refuse the configuration with the key to fix.
What a value is reads the same everywhere (args.what, args.show): "null", "an empty string",
"a string", "the integer 3", "the float 0.25", "a boolean", "an array", "an object".

Errors blame the policy line that called the library: a helper that may raise takes lvl, the
error level of that line as seen from the helper (2 in a public function, one more for each
helper in between).  A call to such a helper must not be a tail call (a tail call drops a stack
level), hence "return (helper(...))".
]]

local gg = require "gpuguard"

local M = {}

--- fail(lvl, fname, fmt, ...) for module mod: raises "<mod>.<fname>: <message>" at level lvl of
--- the function calling fail.
function M.failer(mod)
    local prefix = mod .. "."
    return function(lvl, fname, fmt, ...)
        error(prefix .. fname .. ": " .. string.format(fmt, ...), lvl + 1)
    end
end

--- Raise "<path>: <message>" for a configuration mistake at key path.
function M.config_fail(path, fmt, ...)
    error(path .. ": " .. string.format(fmt, ...), 0)
end

--- What v is, for messages.
function M.what(v)
    if v == nil or v == gg.null then
        return "null"
    elseif v == "" then
        return "an empty string"
    elseif math.type(v) == "integer" then
        return "the integer " .. v
    elseif math.type(v) == "float" then
        return "the float " .. string.format("%.14g", v)
    elseif type(v) == "table" then
        return gg.is_array(v) and "an array" or "an object"
    end
    return "a " .. type(v)
end

--- A user's value for messages: a string quoted (control characters, quotes and backslashes as
--- "?", cut to 40 characters), anything else as args.what says.
function M.show(v)
    if type(v) ~= "string" then
        return M.what(v)
    end
    local s = v:gsub("[%c\"\\]", "?")
    if #s > 40 then
        s = s:sub(1, 37) .. "..."
    end
    return '"' .. s .. '"'
end

return M
