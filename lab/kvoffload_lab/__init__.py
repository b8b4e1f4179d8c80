"""The local lab: emulated engines, the local cluster, load, the demo and its report. The operator never imports it."""
