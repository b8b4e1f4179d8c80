"""Tests of kvoffload_lab: the local lab."""
