"""share-webhook: admission for gpushare. Sets `schedulerName: gpushare-scheduler` on pods that ask
`nvidia.com/gpu-mem` and name no scheduler, and refuses at `kubectl apply` what the extender could never
place, with the extender's own messages (share_core.admission).

Its own program (not a mode of the extender): it runs on a different path (the API server's admission
chain, every pod create, HTTPS with its own certificate), must stay up when the extender's leader moves,
and scales by replicas, which the extender's one-process cache cannot.
"""
