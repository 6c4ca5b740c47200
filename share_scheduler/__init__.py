"""share_scheduler: the kube-scheduler extender, its placement policies, and the trace simulator."""
