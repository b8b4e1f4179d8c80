"""pytest fixtures: engines (owned by one helper; registered in tests/conftest.py)."""
