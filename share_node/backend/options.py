"""The node agents' common command-line options (their node, the GPU backend) and the backend's construction,
shared by share-plugin and share-dra (both read the same GPUs the same way; only what they publish differs)."""

from __future__ import annotations

import argparse
import os
from typing import Any

from share_core.config import add_config_arg
from share_core.contract import DEFAULT_CGROUP_ROOT
from share_core.contract import HARD_LIMIT_MODES
from share_core.contract import HardLimitMode
from share_node.backend import GpuBackend
from share_node.hardlimit import MemoryLimits


def env_bool(name: str, default: bool) -> bool:
    """A boolean flag's default from the environment (1/true/yes/on), for the chart's env-only settings."""
    raw = os.environ.get(name)
    return default if raw is None else raw.strip().lower() in ("1", "true", "yes", "on")


def env_arg(
    p: argparse.ArgumentParser, flag: str, var: str, default: Any = None, help: str | None = None, **kw: Any
) -> None:
    """A flag whose default is environment variable `var` (how the chart sets it), else `default`; with a
    `type`, the variable's text is converted by it."""
    raw = os.environ.get(var)
    if raw is not None:
        default = kw["type"](raw) if "type" in kw else raw
    p.add_argument(flag, default=default, help=help, **kw)


def agent_parser(prog: str, description: str) -> argparse.ArgumentParser:
    """A node agent's parser, holding what every agent is told: its configuration file, the node it serves,
    how it reaches the API server, whether the driver holds each pod to its share (the hard limit), how
    much it logs."""
    p = argparse.ArgumentParser(prog=prog, description=description)
    add_config_arg(p)
    env_arg(p, "--node-name", "NODE_NAME", help="this node's name (env NODE_NAME)")
    env_arg(p, "--kubeconfig", "KUBECONFIG", help="kubeconfig file; in-cluster config if unset")
    env_arg(
        p,
        "--hard-limit",
        "GPUSHARE_HARD_LIMIT",
        HardLimitMode.AUTO,
        choices=list(HARD_LIMIT_MODES),
        help="a hard GPU memory limit per pod (its share of each GPU), enforced by the NVIDIA driver per cgroup "
        "(R615+, cgroup v2, not MIG): auto (where supported, else say why and fall back), cgroup (required: "
        "refuse to start without), off",
    )
    env_arg(p, "--log-level", "LOG_LEVEL", "INFO")
    return p


def add_backend_args(p: argparse.ArgumentParser) -> None:
    env_arg(p, "--backend", "GPUSHARE_BACKEND", "nvml", choices=["nvml", "sim"])
    env_arg(p, "--sim-gpus", "SIM_GPUS", "2xA100:80GiB,1xT4:16GiB", help="e.g. 4xT4:16GiB")
    env_arg(
        p,
        "--sim-health-file",
        "GPUSHARE_SIM_HEALTH_FILE",
        help="sim backend: file listing unhealthy GPUs (index or UUID per line), polled",
    )
    p.add_argument("--health-check", action=argparse.BooleanOptionalAction, default=env_bool("HEALTH_CHECK", True))
    env_arg(
        p,
        "--ignored-xids",
        "GPUSHARE_IGNORED_XIDS",
        help="comma-separated XIDs that do not make a GPU unhealthy (default 13,31,43,45,68,109)",
    )
    # The hard limit's ground (--hard-limit itself is each agent's own flag).
    env_arg(
        p,
        "--cgroup-root",
        "GPUSHARE_CGROUP_ROOT",
        DEFAULT_CGROUP_ROOT,
        help="--hard-limit: the cgroup v2 mount where kubelet's pod cgroups are found (the host's, mounted at the "
        "same path: NVML takes the full path)",
    )
    env_arg(
        p,
        "--sim-driver-version",
        "GPUSHARE_SIM_DRIVER_VERSION",
        "615.0",
        help="sim backend: the driver version the NVML stand-in reports (below 615: memory limits NOT_SUPPORTED)",
    )
    env_arg(
        p,
        "--sim-memory-limits-file",
        "GPUSHARE_SIM_MEMORY_LIMITS_FILE",
        help="sim backend: where the NVML stand-in keeps per-cgroup memory limits (the driver's state; it "
        "outlives the agent)",
    )
    p.add_argument(
        "--sim-accept-cgroup-v1",
        action=argparse.BooleanOptionalAction,
        default=env_bool("GPUSHARE_SIM_ACCEPT_CGROUP_V1", False),
        help="sim backend: the NVML stand-in takes cgroup v1 paths too (test machines without cgroup v2)",
    )


def open_backend(args: argparse.Namespace, node: str, processes_file: str | None = None) -> GpuBackend:
    """The backend `add_backend_args` options name. Raises BackendError (or ValueError for bad options)."""
    if args.backend == "sim":
        from share_node.backend.sim import SimBackend

        return SimBackend(args.sim_gpus, node, health_file=args.sim_health_file, processes_file=processes_file)
    from share_node.backend.nvml import DEFAULT_IGNORED_XIDS
    from share_node.backend.nvml import NvmlBackend
    from share_node.backend.nvml import parse_xids

    xids = parse_xids(args.ignored_xids) if args.ignored_xids is not None else DEFAULT_IGNORED_XIDS
    return NvmlBackend(xids)


def open_memory_limits(args: argparse.Namespace, backend: GpuBackend, node: str) -> MemoryLimits:
    """The per-cgroup memory limit adapter for `backend`: NVML's, or the stand-in's for the sim backend."""
    if backend.name == "sim":
        import tempfile

        from share_node.backend.simlimits import SimMemoryLimits

        state = args.sim_memory_limits_file or os.path.join(
            tempfile.gettempdir(), f"gpushare-sim-memory-limits-{node}.json"
        )
        return SimMemoryLimits(
            state,
            args.sim_driver_version,
            mig_uuids=[g.uuid for g in backend.gpus() if g.parent_uuid],
            readings=backend.readings,
            accept_cgroup_v1=args.sim_accept_cgroup_v1,
        )
    from share_node.backend.nvml import NvmlBackend
    from share_node.backend.nvml import NvmlMemoryLimits

    assert isinstance(backend, NvmlBackend)
    return NvmlMemoryLimits(backend)
