"""A node agent's start and stop, the same for share-plugin and share-dra: its GPU backend and API server
client opened from its options (each failure logged, naming what to fix), and the signals that stop it."""

from __future__ import annotations

import argparse
import logging
import signal
import threading
from typing import TYPE_CHECKING

from share_node.backend import GpuBackend
from share_node.backend.options import open_backend

if TYPE_CHECKING:
    from share_core.kube import ApiServerClient


def open_agent(
    args: argparse.Namespace, component: str, log: logging.Logger, processes_file: str | None = None
) -> tuple[GpuBackend, ApiServerClient] | None:
    """The backend `args` name, for `args.node_name`, and a client of the API server as `component`; None
    (the reason logged) where either cannot be had."""
    from share_core.kube import ApiServerClient
    from share_node.backend import BackendError

    try:
        backend = open_backend(args, args.node_name, processes_file=processes_file)
    except (BackendError, ValueError) as exc:
        log.error("cannot start the %s backend: %s", args.backend, exc)
        return None
    try:
        client = ApiServerClient.from_kubeconfig(args.kubeconfig, component=component, timeout=5.0)
    except Exception as exc:
        log.error("cannot load the Kubernetes client configuration (%s): %s", args.kubeconfig or "in-cluster", exc)
        return None
    return backend, client


def stop_on_signals(log: logging.Logger, *events: threading.Event) -> None:
    """SIGTERM and SIGINT set each of `events` (the agent's stop, and whatever must wake to see it)."""

    def on_signal(signum: int, _frame: object) -> None:
        log.info("received %s: stopping", signal.Signals(signum).name)
        for event in events:
            event.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
