"""The ladder state machine: decide(), its types, conditions and texts."""
