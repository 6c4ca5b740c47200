"""Ground both node agents stand on: the GPU backends (nvml, sim) and the env a container is given.

`share_plugin` (device plugin) and `share_dra` (DRA kubelet plugin) import this package; it imports only
`share_core`, so neither agent depends on the other's internals.
"""
