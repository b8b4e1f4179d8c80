"""The local cluster: the emulated API server and the kubelet stand-in."""
