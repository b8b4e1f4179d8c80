"""The controller: reconcile, the kopf handlers, the Kubernetes gateway and the operator's own metrics."""
