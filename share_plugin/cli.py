"""`share-plugin`: the gpushare device plugin's command line."""

from __future__ import annotations

import argparse
import logging
import threading

from share_core.config import parse_args
from share_core.config import start_logging
from share_core.contract import ANN_NODE_GPUS
from share_core.contract import DEFAULT_DEVICE_PLUGIN_DIR
from share_core.contract import DEFAULT_MPS_PIPE_DIR
from share_core.contract import DEFAULT_POD_RESOURCES_SOCKET
from share_core.contract import DEVICE_LIST_STRATEGIES
from share_core.contract import RESOURCE_COUNT
from share_core.contract import RESOURCE_MEM
from share_core.contract import DeviceListStrategy
from share_core.contract import MemoryUnit
from share_node.agent import open_agent
from share_node.agent import stop_on_signals
from share_node.backend.options import add_backend_args
from share_node.backend.options import agent_parser
from share_node.backend.options import env_arg
from share_node.backend.options import env_bool
from share_plugin.monitor import DEFAULT_INTERVAL
from share_plugin.usage import OverLimitMode

log = logging.getLogger("share_plugin")


def build_parser() -> argparse.ArgumentParser:
    p = agent_parser("share-plugin", f"kubelet device plugin advertising {RESOURCE_MEM}")
    env_arg(p, "--device-plugin-dir", "DEVICE_PLUGIN_DIR", DEFAULT_DEVICE_PLUGIN_DIR)
    env_arg(p, "--pod-resources-socket", "POD_RESOURCES_SOCKET", DEFAULT_POD_RESOURCES_SOCKET)
    add_backend_args(p)
    env_arg(p, "--memory-unit", "MEMORY_UNIT", "GiB", choices=["GiB", "MiB"])
    env_arg(p, "--device-id-strategy", "DEVICE_ID_STRATEGY", "uuid", choices=["uuid", "index"])
    env_arg(
        p,
        "--device-list-strategy",
        "DEVICE_LIST_STRATEGY",
        DeviceListStrategy.ENVVAR,
        choices=list(DEVICE_LIST_STRATEGIES),
        help="how the container runtime learns the GPU: envvar (NVIDIA_VISIBLE_DEVICES), volume-mounts "
        "(mounts the NVIDIA toolkit reads; a pod cannot forge them), cdi-cri (CDI device names in Allocate)",
    )
    p.add_argument("--mps", action=argparse.BooleanOptionalAction, default=env_bool("GPUSHARE_MPS", False))
    env_arg(
        p,
        "--mps-pipe-dir",
        "GPUSHARE_MPS_PIPE_DIR",
        DEFAULT_MPS_PIPE_DIR,
        help="with --mps: the MPS control daemon's pipe directory on the node, mounted into each container",
    )
    env_arg(
        p,
        "--mps-shm-dir",
        "GPUSHARE_MPS_SHM_DIR",
        "",
        help="with --mps: the directory on the node the daemon uses as /dev/shm, mounted as each container's /dev/shm",
    )
    env_arg(
        p,
        "--monitor-interval",
        "GPUSHARE_MONITOR_INTERVAL",
        DEFAULT_INTERVAL,
        type=float,
        help="seconds between polls of the GPU memory each container uses (0: no monitoring, no metrics)",
    )
    env_arg(p, "--metrics-port", "GPUSHARE_METRICS_PORT", 9445, type=int)
    env_arg(p, "--metrics-address", "GPUSHARE_METRICS_ADDRESS", "0.0.0.0")
    env_arg(
        p,
        "--over-limit",
        "GPUSHARE_OVER_LIMIT",
        OverLimitMode.WARN.value,
        choices=[m.value for m in OverLimitMode],
        help="a container over its GPU memory limit: warn (Event, log, metric) or kill (also end its processes "
        "on that GPU after --over-limit-grace)",
    )
    env_arg(p, "--over-limit-grace", "GPUSHARE_OVER_LIMIT_GRACE", 30.0, type=float)
    env_arg(p, "--proc-root", "GPUSHARE_PROC_ROOT", "/proc", help="where process cgroups are read (tests)")
    p.add_argument("--usage-annotation-interval", type=float, default=30.0, help="seconds between writes, at least")
    p.add_argument("--usage-annotation-threshold", type=int, default=256, help="MiB a figure must move to be written")
    p.add_argument(
        "--inventory-interval",
        type=float,
        default=30.0,
        help="seconds between looks for changed GPUs (a new MIG layout is republished); 0: never",
    )
    env_arg(
        p,
        "--sim-processes-file",
        "GPUSHARE_SIM_PROCESSES_FILE",
        help='sim backend: JSON list of simulated GPU processes [{"pid": N, "gpu": index, "usedMiB": N}], polled',
    )
    p.add_argument(
        "--unpublish",
        action="store_true",
        help=f"remove the {ANN_NODE_GPUS} annotation and {RESOURCE_COUNT} capacity from --node-name, or from "
        "every node carrying them, then exit (the chart runs this when it is uninstalled)",
    )
    return p


def main(argv: list[str] | None = None) -> int:
    args = parse_args(build_parser(), argv)
    start_logging(args.log_level)
    if args.unpublish:
        return _unpublish(args.kubeconfig, args.node_name)
    if not args.node_name:
        log.error("--node-name (or env NODE_NAME) is required: the plugin serves the pods bound to its node")
        return 2

    from share_plugin.allocator import AllocateOptions
    from share_plugin.allocator import Allocator
    from share_plugin.devices import DeviceListTooLarge
    from share_plugin.node import PluginNode
    from share_plugin.podresources import PodResourcesClient
    from share_plugin.publisher import Publisher
    from share_plugin.server import DevicePlugin
    from share_plugin.server import PluginConfig

    unit = MemoryUnit.parse(args.memory_unit)
    if (opened := open_agent(args, "gpushare-device-plugin", log, args.sim_processes_file)) is None:
        return 1
    backend, kube = opened
    node = PluginNode(args.node_name, kube, backend, unit)
    config = PluginConfig(
        device_plugin_dir=args.device_plugin_dir,
        health_check=args.health_check,
        inventory_interval=args.inventory_interval,
    )
    pod_resources = PodResourcesClient(args.pod_resources_socket, config.resource)
    options = AllocateOptions(
        device_id_strategy=args.device_id_strategy,
        device_list_strategy=args.device_list_strategy,
        mps=args.mps,
        mps_pipe_dir=args.mps_pipe_dir,
        mps_shm_dir=args.mps_shm_dir,
    )
    allocator = Allocator(node, pod_resources, options)
    if args.mps and (problem := allocator.mps_problem()) is not None:
        log.warning(
            "node %s: MPS mode, but the MPS control daemon is not reachable (%s): Allocate is refused until it is",
            args.node_name,
            problem,
        )
    from share_node.hardlimit import HardLimitError
    from share_plugin import hardlimit

    try:
        hard_limit = hardlimit.setup(args.hard_limit, args, node, allocator.pod_of_devices)
    except HardLimitError as exc:
        log.error("node %s: %s", args.node_name, exc)
        return 1
    try:
        plugin = DevicePlugin(node, config, allocator, Publisher(args.node_name, kube), hard_limit=hard_limit)
    except DeviceListTooLarge as exc:
        log.error("node %s: %s", args.node_name, exc)
        return 1

    stop = threading.Event()
    stop_on_signals(log, stop, plugin.stopping)
    log.info(
        "node %s: %s backend, %d GPUs, unit %s, %d devices",
        args.node_name,
        backend.name,
        len(backend.gpus()),
        unit.value,
        len(plugin.devices().devices),
    )
    starter = threading.Thread(target=plugin.start, name="start", daemon=True)
    starter.start()
    metrics_server = None
    if args.monitor_interval > 0:
        from share_plugin import metrics
        from share_plugin.monitor import Monitor
        from share_plugin.monitor import ProcFs

        monitor = Monitor(
            node,
            mode=OverLimitMode(args.over_limit),
            grace=args.over_limit_grace,
            interval=args.monitor_interval,
            proc=ProcFs(args.proc_root),
            annotation_interval=args.usage_annotation_interval,
            annotation_threshold_mib=args.usage_annotation_threshold,
            hard_limit=hard_limit,
        )
        try:
            metrics_server = metrics.serve(monitor, args.metrics_port, args.metrics_address)
        except OSError as exc:
            log.error("node %s: cannot serve metrics on port %d: %s", args.node_name, args.metrics_port, exc)
            return 1
        threading.Thread(target=monitor.run, args=(stop,), name="monitor", daemon=True).start()
        log.info(
            "node %s: measuring GPU memory per container every %.0fs, over-limit %s (grace %.0fs)",
            args.node_name,
            args.monitor_interval,
            args.over_limit,
            args.over_limit_grace,
        )
    stop.wait()
    starter.join(timeout=5)
    if metrics_server is not None:
        metrics_server.shutdown()
    plugin.stop()
    pod_resources.close()
    return 0


def _unpublish(kubeconfig: str | None, node: str | None) -> int:
    from share_core.kube import ApiServerClient
    from share_core.kube import KubeError
    from share_plugin.publisher import unpublish

    try:
        kube = ApiServerClient.from_kubeconfig(kubeconfig, component="gpushare-device-plugin", timeout=10.0)
        cleaned = unpublish(kube, node)
    except KubeError as exc:
        log.error("cannot remove the published GPU state from %s: %s", node or "the nodes", exc)
        return 1
    log.info("removed gpushare's GPU state from %d node(s): %s", len(cleaned), ", ".join(cleaned) or "none")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
