"""A policy's catalogs, ladder, sizing and rendering: pure functions of the spec."""
