-- Sets kvoffload.io/abort to a new value, as `kvoffload abort NAME` does; the operator acts once per new value.
local os = require("os")
local key = "kvoffload.io/abort"
if obj.metadata.annotations == nil then
  obj.metadata.annotations = {}
end
local stamp = os.date("!%Y-%m-%dT%H:%M:%SZ")
local previous = obj.metadata.annotations[key]
local value = stamp
if previous ~= nil and string.sub(previous, 1, string.len(stamp)) == stamp then
  -- the same second as the value already there: count up, so the value still changes
  local count = tonumber(string.match(previous, "#(%d+)$"))
  value = stamp .. "#" .. tostring((count or 1) + 1)
end
obj.metadata.annotations[key] = value
return obj
