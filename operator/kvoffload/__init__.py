"""kvoffload: roll out vLLM KV-cache offloading tier by tier, on SLO evidence."""

__version__ = "0.1.0"
