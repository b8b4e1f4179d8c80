-- Argo CD health of a kvoffload.io/KVOffloadPolicy (kvoffload's rollout of vLLM KV-cache offloading).
--   Progressing  the operator has not acted on this generation yet, or the ladder climbs
--                (Pending, Baseline, Canary, Promoting)
--   Healthy      Stable: the top level runs on every replica
--   Suspended    paused by a person (kvoffload.io/pause); set kvoffload.io/resume to go on
--   Degraded     RolledBack, Invalid, or paused after too many Inconclusive analyses in a row
-- Generated into argocd-cm by scripts/argocd_cm.py; tested in Lua 5.1 against real status captures.
local hs = {}

local function condition(status, type_)
  if status.conditions == nil then
    return nil
  end
  for _, c in ipairs(status.conditions) do
    if c.type == type_ then
      return c
    end
  end
  return nil
end

local function is_true(status, type_)
  local c = condition(status, type_)
  return c ~= nil and c.status == "True"
end

local function say(phase, text)
  if text ~= nil and text ~= "" then
    return phase .. ": " .. text
  end
  return phase
end

local status = obj.status
if status == nil then
  hs.status = "Progressing"
  hs.message = "Waiting for the kvoffload operator to act on the policy"
  return hs
end

local generation = obj.metadata.generation
local observed = status.observedGeneration
if generation ~= nil and (observed == nil or observed < generation) then
  hs.status = "Progressing"
  hs.message = "Waiting for the kvoffload operator to act on generation " .. tostring(generation) ..
    " (last acted on " .. tostring(observed or 0) .. ")"
  return hs
end

local phase = status.phase or "Pending"
local invalid = condition(status, "Invalid")
if phase == "Invalid" or (invalid ~= nil and invalid.status == "True") then
  hs.status = "Degraded"
  hs.message = say("Invalid", invalid ~= nil and invalid.message or status.message)
  return hs
end
if phase == "RolledBack" or is_true(status, "Stalled") then
  hs.status = "Degraded"
  hs.message = say(phase, status.message)
  return hs
end
local inconclusive = condition(status, "AnalysisInconclusive")
if inconclusive ~= nil and inconclusive.status == "True" then
  hs.status = "Degraded"
  hs.message = say("Paused on inconclusive evidence", inconclusive.message)
  return hs
end
if is_true(status, "Paused") then
  hs.status = "Suspended"
  hs.message = say("Paused", status.message)
  return hs
end
if phase == "Stable" then
  hs.status = "Healthy"
  hs.message = say("Stable", status.message)
  return hs
end
hs.status = "Progressing"
hs.message = say(phase, status.message)
return hs
