"""`share-dra`: gpushare's DRA kubelet plugin (driver `gpushare.io`, resource.k8s.io/v1, Kubernetes 1.34+).

Publishes the node's ResourceSlice (one device per healthy GPU, `memory` shared between claims), serves
kubelet's NodePrepareResources / NodeUnprepareResources with a CDI spec per claim, and registers with kubelet.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import threading
from pathlib import Path

from share_core.config import add_config_arg, parse_args, start_logging
from share_core.contract import (
    DEFAULT_CDI_DIR,
    DEFAULT_CDI_SPEC_DIRS,
    DEFAULT_DRA_PLUGIN_DIR,
    DEFAULT_PLUGINS_REGISTRY_DIR,
    DRA_DRIVER_NAME,
    DRA_UNHEALTHY_MODES,
    DRA_UNHEALTHY_WITHDRAW,
    MemoryUnit,
)
from share_node.backend.options import add_agent_args, add_backend_args, open_backend
from share_placement import POLICIES

log = logging.getLogger("share_dra")


def build_parser() -> argparse.ArgumentParser:
    env = os.environ.get
    p = argparse.ArgumentParser(prog="share-dra", description=f"DRA kubelet plugin for driver {DRA_DRIVER_NAME}")
    add_config_arg(p)
    add_agent_args(p)
    p.add_argument(
        "--plugins-registry-dir",
        default=env("GPUSHARE_PLUGINS_REGISTRY_DIR", DEFAULT_PLUGINS_REGISTRY_DIR),
        help="kubelet's plugin watcher dir; the registration socket is created there",
    )
    p.add_argument(
        "--plugin-dir",
        default=env("GPUSHARE_DRA_PLUGIN_DIR", DEFAULT_DRA_PLUGIN_DIR),
        help="the DRA service socket (dra.sock) and the checkpoint live here",
    )
    p.add_argument(
        "--endpoint",
        default=env("GPUSHARE_DRA_ENDPOINT", ""),
        help="the DRA socket's path as kubelet sees it, if not <plugin-dir>/dra.sock",
    )
    p.add_argument("--cdi-dir", default=env("GPUSHARE_CDI_DIR", DEFAULT_CDI_DIR), help="where claim CDI specs go")
    p.add_argument(
        "--cdi-spec-dirs",
        default=env("GPUSHARE_CDI_SPEC_DIRS", ",".join(DEFAULT_CDI_SPEC_DIRS)),
        help="comma-separated dirs where NVIDIA's CDI spec (nvidia.com/gpu) may be; its devices are referenced",
    )
    add_backend_args(p)
    p.add_argument(
        "--memory-unit",
        default=env("MEMORY_UNIT", "GiB"),
        choices=["GiB", "MiB"],
        help="the step claims consume memory in (the request policy's default, minimum and step)",
    )
    p.add_argument(
        "--unhealthy",
        choices=list(DRA_UNHEALTHY_MODES),
        default=env("GPUSHARE_DRA_UNHEALTHY", DRA_UNHEALTHY_WITHDRAW),
        help="an unhealthy GPU: withdraw it from the slice (any Kubernetes), or taint it NoSchedule and keep it "
        "listed (needs DRADeviceTaints: Kubernetes 1.36+)",
    )
    p.add_argument("--device-id-strategy", choices=["uuid", "index"], default=env("DEVICE_ID_STRATEGY", "uuid"))
    p.add_argument("--resync", type=float, default=60.0, help="seconds between checks of the published slice")
    p.add_argument(
        "--policy",
        default=env("GPUSHARE_POLICY", ""),
        choices=["", *sorted(POLICIES)],
        help="list the GPUs in this placement policy's order, kept as claims come and go, so kube-scheduler's "
        "first fit takes the GPU the policy would (watches every ResourceClaim); empty (default): index order",
    )
    return p


def main(argv: list[str] | None = None) -> int:
    args = parse_args(build_parser(), argv)
    start_logging(args.log_level)
    if not args.node_name:
        log.error("--node-name (or env NODE_NAME) is required: the slice is published for that node")
        return 2

    from share_core.kube import ApiServerClient
    from share_dra.driver import CHECKPOINT_NAME, Checkpoint, Driver
    from share_dra.kubeapi import ApiServerDraApi
    from share_dra.publisher import SlicePublisher
    from share_dra.server import PluginServers, Sockets
    from share_node.backend import BackendError

    unit = MemoryUnit.parse(args.memory_unit)
    try:
        backend = open_backend(args, args.node_name)
    except (BackendError, ValueError) as exc:
        log.error("cannot start the %s backend: %s", args.backend, exc)
        return 1
    try:
        client = ApiServerClient.from_kubeconfig(args.kubeconfig, component="gpushare-dra", timeout=5.0)
    except Exception as exc:
        log.error("cannot load the Kubernetes client configuration (%s): %s", args.kubeconfig or "in-cluster", exc)
        return 1
    api = ApiServerDraApi(client)
    driver_version = str(getattr(backend, "driver_version", "") or "")
    usage = None
    order = None
    if args.policy:
        from share_dra.order import ClaimUsage, policy_order
        from share_placement import make_policy
        from share_placement.draorder import DeviceOrderer

        usage = ClaimUsage(args.node_name, unit, DeviceOrderer(make_policy(args.policy)), lambda: publisher.kick.set())
        order = policy_order(args.node_name, usage, unit)
    publisher = SlicePublisher(api, args.node_name, backend.gpus, unit, driver_version, args.unhealthy, order)
    from share_dra import hardlimit
    from share_node.hardlimit import HardLimitError

    try:
        support, limiter = hardlimit.setup(args.hard_limit, args, args.node_name, backend)
    except HardLimitError as exc:
        log.error("node %s: %s", args.node_name, exc)
        return 1
    hardlimit.publish(support, args.node_name, client)
    try:
        driver = Driver(
            args.node_name,
            backend.gpus,
            api,
            args.cdi_dir,
            Checkpoint(Path(args.plugin_dir) / CHECKPOINT_NAME),
            unit,
            [d for d in args.cdi_spec_dirs.split(",") if d],
            args.device_id_strategy,
            limiter,
        )
    except RuntimeError as exc:
        log.error("%s", exc)
        return 1
    servers = PluginServers(
        driver,
        Sockets(args.plugins_registry_dir, args.plugin_dir, args.endpoint),
        on_registered=publisher.kick_after_registration,
    )
    try:
        servers.start()
    except (OSError, RuntimeError) as exc:
        log.error("cannot serve the kubelet sockets (%s, %s): %s", args.plugin_dir, args.plugins_registry_dir, exc)
        return 1

    stop = threading.Event()

    def on_signal(signum: int, _frame: object) -> None:
        log.info("received %s: stopping", signal.Signals(signum).name)
        stop.set()
        publisher.kick.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)

    def on_health(uuid: str, healthy: bool, why: str) -> None:
        log.warning("GPU %s is %s (%s): updating the ResourceSlice", uuid, "healthy" if healthy else "UNHEALTHY", why)
        publisher.kick.set()

    if limiter is not None:
        threading.Thread(
            target=hardlimit.run, args=(limiter, driver.pod_limits(), stop), name="hard-limit", daemon=True
        ).start()
    if usage is not None:
        threading.Thread(target=usage.run, args=(client, stop), name="claim-usage", daemon=True).start()
    if args.health_check:
        threading.Thread(target=backend.watch_health, args=(stop, on_health), name="health", daemon=True).start()
    log.info(
        "node %s: %s backend, %d GPUs (%s), memory in steps of 1 %s",
        args.node_name,
        backend.name,
        len(backend.gpus()),
        ", ".join(f"{g.index}: {g.model} {g.memory_mib} MiB" for g in backend.gpus()),
        unit.value,
    )
    publisher.run(stop, resync=args.resync)
    servers.stop()
    backend.close()
    return 0
