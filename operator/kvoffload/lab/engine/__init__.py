"""The engine emulator: vLLM's /metrics and cache behaviour, priced by a cost model."""
