"""The local cluster: the emulated API server and the kubelet stand-in.

``kubeemu`` serves the API; the ``kubelet`` keeps each Deployment's pods (by the rules in
``deployments``) running as ``engines``, one ``podengine`` per pod (an SGLang container's
command line translated by ``sglangargs``); ``localcluster`` puts them together with a real
Prometheus.
"""
