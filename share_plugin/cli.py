"""`share-plugin`: the gpushare device plugin's command line."""

from __future__ import annotations

import argparse
import logging
import os
import signal
import threading

from share_core.config import add_config_arg, parse_args, start_logging
from share_core.contract import (
    ANN_NODE_GPUS,
    DEFAULT_DEVICE_PLUGIN_DIR,
    DEFAULT_MPS_PIPE_DIR,
    DEFAULT_POD_RESOURCES_SOCKET,
    DEVICE_LIST_ENVVAR,
    DEVICE_LIST_STRATEGIES,
    RESOURCE_COUNT,
    RESOURCE_MEM,
    MemoryUnit,
)
from share_node.backend.options import add_agent_args, add_backend_args, env_bool, open_backend
from share_plugin.monitor import DEFAULT_INTERVAL
from share_plugin.usage import OverLimitMode

log = logging.getLogger("share_plugin")


def build_parser() -> argparse.ArgumentParser:
    env = os.environ.get
    p = argparse.ArgumentParser(prog="share-plugin", description=f"kubelet device plugin advertising {RESOURCE_MEM}")
    add_config_arg(p)
    add_agent_args(p)
    p.add_argument("--device-plugin-dir", default=env("DEVICE_PLUGIN_DIR", DEFAULT_DEVICE_PLUGIN_DIR))
    p.add_argument("--pod-resources-socket", default=env("POD_RESOURCES_SOCKET", DEFAULT_POD_RESOURCES_SOCKET))
    add_backend_args(p)
    p.add_argument("--memory-unit", default=env("MEMORY_UNIT", "GiB"), choices=["GiB", "MiB"])
    p.add_argument("--device-id-strategy", choices=["uuid", "index"], default=env("DEVICE_ID_STRATEGY", "uuid"))
    p.add_argument(
        "--device-list-strategy",
        choices=list(DEVICE_LIST_STRATEGIES),
        default=env("DEVICE_LIST_STRATEGY", DEVICE_LIST_ENVVAR),
        help="how the container runtime learns the GPU: envvar (NVIDIA_VISIBLE_DEVICES), volume-mounts "
        "(mounts the NVIDIA toolkit reads; a pod cannot forge them), cdi-cri (CDI device names in Allocate)",
    )
    p.add_argument("--mps", action=argparse.BooleanOptionalAction, default=env_bool("GPUSHARE_MPS", False))
    p.add_argument(
        "--mps-pipe-dir",
        default=env("GPUSHARE_MPS_PIPE_DIR", DEFAULT_MPS_PIPE_DIR),
        help="with --mps: the MPS control daemon's pipe directory on the node, mounted into each container",
    )
    p.add_argument(
        "--mps-shm-dir",
        default=env("GPUSHARE_MPS_SHM_DIR", ""),
        help="with --mps: the directory on the node the daemon uses as /dev/shm, mounted as each container's /dev/shm",
    )
    p.add_argument(
        "--monitor-interval",
        type=float,
        default=float(env("GPUSHARE_MONITOR_INTERVAL", str(DEFAULT_INTERVAL))),
        help="seconds between polls of the GPU memory each container uses (0: no monitoring, no metrics)",
    )
    p.add_argument("--metrics-port", type=int, default=int(env("GPUSHARE_METRICS_PORT", "9445")))
    p.add_argument("--metrics-address", default=env("GPUSHARE_METRICS_ADDRESS", "0.0.0.0"))
    p.add_argument(
        "--over-limit",
        choices=[m.value for m in OverLimitMode],
        default=env("GPUSHARE_OVER_LIMIT", OverLimitMode.WARN.value),
        help="a container over its GPU memory limit: warn (Event, log, metric) or kill (also end its processes "
        "on that GPU after --over-limit-grace)",
    )
    p.add_argument("--over-limit-grace", type=float, default=float(env("GPUSHARE_OVER_LIMIT_GRACE", "30")))
    p.add_argument(
        "--proc-root", default=env("GPUSHARE_PROC_ROOT", "/proc"), help="where process cgroups are read (tests)"
    )
    p.add_argument("--usage-annotation-interval", type=float, default=30.0, help="seconds between writes, at least")
    p.add_argument("--usage-annotation-threshold", type=int, default=256, help="MiB a figure must move to be written")
    p.add_argument(
        "--inventory-interval",
        type=float,
        default=30.0,
        help="seconds between looks for changed GPUs (a new MIG layout is republished); 0: never",
    )
    p.add_argument(
        "--sim-processes-file",
        default=env("GPUSHARE_SIM_PROCESSES_FILE"),
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

    from share_core.kube import ApiServerClient
    from share_node.backend import BackendError
    from share_plugin.allocator import Allocator
    from share_plugin.devices import DeviceListTooLarge
    from share_plugin.podresources import PodResourcesClient
    from share_plugin.publisher import Publisher
    from share_plugin.server import DevicePlugin, PluginConfig

    unit = MemoryUnit.parse(args.memory_unit)
    try:
        backend = open_backend(args, args.node_name, processes_file=args.sim_processes_file)
    except (BackendError, ValueError) as exc:
        log.error("cannot start the %s backend: %s", args.backend, exc)
        return 1
    try:
        kube = ApiServerClient.from_kubeconfig(args.kubeconfig, component="gpushare-device-plugin", timeout=5.0)
    except Exception as exc:
        log.error("cannot load the Kubernetes client configuration (%s): %s", args.kubeconfig or "in-cluster", exc)
        return 1
    config = PluginConfig(
        node=args.node_name,
        device_plugin_dir=args.device_plugin_dir,
        unit=unit,
        health_check=args.health_check,
        inventory_interval=args.inventory_interval,
    )
    pod_resources = PodResourcesClient(args.pod_resources_socket, config.resource)
    allocator = Allocator(
        args.node_name,
        kube,
        backend,
        unit,
        pod_resources,
        args.device_id_strategy,
        args.mps,
        device_list_strategy=args.device_list_strategy,
        mps_pipe_dir=args.mps_pipe_dir,
        mps_shm_dir=args.mps_shm_dir,
    )
    if args.mps and (problem := allocator.mps_problem()) is not None:
        log.warning(
            "node %s: MPS mode, but the MPS control daemon is not reachable (%s): Allocate is refused until it is",
            args.node_name,
            problem,
        )
    from share_node.hardlimit import HardLimitError
    from share_plugin import hardlimit

    try:
        hard_limit = hardlimit.setup(
            args.hard_limit, args, args.node_name, kube, backend, unit, allocator.pod_of_devices
        )
    except HardLimitError as exc:
        log.error("node %s: %s", args.node_name, exc)
        return 1
    try:
        plugin = DevicePlugin(config, backend, allocator, Publisher(args.node_name, kube), hard_limit=hard_limit)
    except DeviceListTooLarge as exc:
        log.error("node %s: %s", args.node_name, exc)
        return 1

    stop = threading.Event()

    def on_signal(signum: int, _frame: object) -> None:
        log.info("received %s: stopping", signal.Signals(signum).name)
        stop.set()
        plugin.stopping.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
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
        from share_plugin.monitor import Monitor, ProcFs

        monitor = Monitor(
            args.node_name,
            backend,
            kube,
            unit,
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
    from share_core.kube import ApiServerClient, KubeError
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
