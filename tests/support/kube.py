"""pytest fixtures: kube (owned by one helper; registered in tests/conftest.py)."""
