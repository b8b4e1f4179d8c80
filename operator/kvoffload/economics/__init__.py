"""Will offload pay: cost profiles, calibration, and cache simulation."""
