"""Analysis: measurements, assess(), the queries in an engine's metric dialect (``engines/dialect.py``), the
Prometheus provider and the hub."""
