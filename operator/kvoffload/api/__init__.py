"""The KVOffloadPolicy resource: its types, quantities, CRD, errors and naming conventions."""
