-- Argo CD actions of a kvoffload.io/KVOffloadPolicy: each sets the annotation `kvoffload <verb> NAME`
-- sets, and is enabled only where the operator would act on it (rollout.decide, "Manual control").
local actions = {}
actions["promote"] = {["disabled"] = true}
actions["abort"] = {["disabled"] = true}
actions["retry"] = {["disabled"] = true}
actions["pause"] = {["disabled"] = true}
actions["resume"] = {["disabled"] = true}

local status = obj.status
if status == nil or status.mode == nil or status.phase == "Invalid" then
  return actions -- not acted on yet, or an invalid spec: the operator reads no annotation
end
local generation = obj.metadata.generation
if generation ~= nil and (status.observedGeneration == nil or status.observedGeneration < generation) then
  return actions -- a new spec the operator has not acted on: it starts a new ladder first
end

local function is_true(type_)
  if status.conditions == nil then
    return false
  end
  for _, c in ipairs(status.conditions) do
    if c.type == type_ then
      return c.status == "True"
    end
  end
  return false
end

local climbing = status.mode == "Baseline" or status.mode == "Step"
local paused = is_true("Paused")
local stopped = paused or is_true("AnalysisInconclusive")

actions["promote"]["disabled"] = not climbing
actions["abort"]["disabled"] = not climbing
actions["retry"]["disabled"] = not (status.mode == "RolledBack" or stopped)
actions["pause"]["disabled"] = status.mode == "RolledBack" or paused
actions["resume"]["disabled"] = not stopped
return actions
