"""vLLM: ``vllm serve`` with its native OffloadingConnector (CPU and filesystem tiers) or LMCache."""
