"""Analysis: measurements, assess(), vLLM's metric dialects, the Prometheus provider and the hub."""
