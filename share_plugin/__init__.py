"""gpushare device plugin: advertises `nvidia.com/gpu-mem` to kubelet and serves each container its GPU."""
