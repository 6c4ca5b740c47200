"""The GPU backend's command-line options and their construction, shared by share-plugin and share-dra
(both node agents read the same GPUs the same way; only what they publish differs)."""

from __future__ import annotations

import argparse
import os

from share_node.backend import GpuBackend


def env_bool(name: str, default: bool) -> bool:
    """A boolean flag's default from the environment (1/true/yes/on), for the chart's env-only settings."""
    raw = os.environ.get(name)
    return default if raw is None else raw.strip().lower() in ("1", "true", "yes", "on")


def add_backend_args(p: argparse.ArgumentParser) -> None:
    env = os.environ.get
    p.add_argument("--backend", choices=["nvml", "sim"], default=env("GPUSHARE_BACKEND", "nvml"))
    p.add_argument("--sim-gpus", default=env("SIM_GPUS", "2xA100:80GiB,1xT4:16GiB"), help="e.g. 4xT4:16GiB")
    p.add_argument(
        "--sim-health-file",
        default=env("GPUSHARE_SIM_HEALTH_FILE"),
        help="sim backend: file listing unhealthy GPUs (index or UUID per line), polled",
    )
    p.add_argument("--health-check", action=argparse.BooleanOptionalAction, default=env_bool("HEALTH_CHECK", True))
    p.add_argument(
        "--ignored-xids",
        default=env("GPUSHARE_IGNORED_XIDS"),
        help="comma-separated XIDs that do not make a GPU unhealthy (default 13,31,43,45,68,109)",
    )


def open_backend(args: argparse.Namespace, node: str, processes_file: str | None = None) -> GpuBackend:
    """The backend `add_backend_args` options name. Raises BackendError (or ValueError for bad options)."""
    if args.backend == "sim":
        from share_node.backend.sim import SimBackend

        return SimBackend(args.sim_gpus, node, health_file=args.sim_health_file, processes_file=processes_file)
    from share_node.backend.nvml import DEFAULT_IGNORED_XIDS, NvmlBackend, parse_xids

    xids = parse_xids(args.ignored_xids) if args.ignored_xids is not None else DEFAULT_IGNORED_XIDS
    return NvmlBackend(xids)
