"""gpushare's DRA kubelet plugin (`share-dra`): driver gpushare.io for resource.k8s.io/v1."""
