"""Tests of kvoffload.lab: the local lab."""
