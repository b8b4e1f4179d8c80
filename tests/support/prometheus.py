"""pytest fixtures: prometheus (owned by one helper; registered in tests/conftest.py)."""
