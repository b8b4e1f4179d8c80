"""pytest fixtures: vllm (owned by one helper; registered in tests/conftest.py)."""
